"""The `tfopt` command line: the top layer, the only one that starts flows and deployments."""
