"""The command line, the benchmark protocol, the plan report, charts, random feeds and the ops table."""
