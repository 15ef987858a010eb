"""The wire schema and the code protoc makes from it (imported only by node/transport/wire.py)."""
