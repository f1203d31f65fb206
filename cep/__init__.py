"""Pure complex-event-processing cores: three-window assignment, uncertainty-aware patterns, the SASE engine."""
