"""The pure algorithm core of murmur: codecs, topologies, replicas and mixing.

Nothing here does I/O, touches asyncio or gRPC, or reads the clock itself: time is injected.
"""
