"""murmur's wire schema and the code protoc generates from it (imported only by node/wire.py)."""
