"""The conformance suite: spec data (TOML), the model zoo, and the checks built from them."""
