"""The 1EdTech Computer Adaptive Testing (CAT) 1.0 REST/JSON binding under ``/ims/cat/v1p0``: a
façade over the session domain (docs/integrations.md). ``views`` serves the standard's
operations, ``results`` maps QTI results to observations and states to results, ``tokens`` writes
the opaque section identifiers and session states, ``status`` gives refusals the standard's
shape."""

from flask import Flask

from . import status, views


def install(app: Flask) -> None:
    app.register_blueprint(views.bp)
    status.install(app)
