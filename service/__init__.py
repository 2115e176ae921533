"""edgecut: adaptive testing with EC² as a REST service (see README.md)."""

# The one version: the package metadata (pyproject.toml) and openapi.yaml read it from here.
__version__ = "0.2.0"
