"""The command shells: one module per `forge-replay` command (or group), each a thin click layer over the floors
below it. ``forge_replay.cli`` registers them lazily, so `forge-replay validate` never imports torch or ray."""
