"""The contract every stage agrees on: the wire protocol (wire/), the Kafka records, topic names, units.

Floor 1: pure, imports nothing of ours. docs/wire-protocol.md and docs/record-contract.md are its twins.
"""
