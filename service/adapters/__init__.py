"""Façades that speak other protocols over the same session domain (service/sessions/)."""
