"""The thesis evaluation harness: K-slack family, oracle, traces, sync simulation, replay.

The gateway never imports it."""
