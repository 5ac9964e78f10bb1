"""The package version: the crate's (Cargo.toml), checked by setup.py when a wheel is built and
by tests/test_api.py."""

__version__ = "0.1.0"
