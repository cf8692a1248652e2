"""The daemon and the command line: config, bus, watchers, pipeline wiring, store, API, CLI."""
