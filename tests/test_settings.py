"""The one settings object: environment in, clear failure on bad values."""

from __future__ import annotations

import pytest

from service.settings import ConfigurationError, load_settings


def test_defaults_from_an_empty_environment(monkeypatch):
    for name in ("REDIS_URL", "SESSION_TTL", "WEB_CONCURRENCY", "LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings()
    assert settings.redis_url is None and settings.uses_memory_store and settings.workers == 1
    assert settings.session_ttl == 86_400 and settings.log_level == "INFO"


def test_the_environment_is_read_and_a_dict_overrides_it(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://cache:6379/2")
    monkeypatch.setenv("WEB_CONCURRENCY", "3")
    monkeypatch.setenv("LOG_LEVEL", "debug")
    settings = load_settings()
    assert settings.redis_url == "redis://cache:6379/2" and settings.workers == 3 and settings.log_level == "DEBUG"
    assert load_settings({"REDIS_URL": None}).uses_memory_store


@pytest.mark.parametrize("name, value", [("SESSION_TTL", "0"), ("SESSION_TTL", "tomorrow"), ("REDIS_URL", "http://x"),
                                         ("LOG_LEVEL", "loud"), ("KEY_PREFIX", "a{b}"), ("MAX_CELLS", "-1"),
                                         ("MAX_BODY_BYTES", "10"), ("WEB_CONCURRENCY", "0"), ("NO_SUCH_SETTING", "1"),
                                         ("REDIS_CLUSTER", "true"), ("REDIS_WAIT_REPLICAS", "-1"),
                                         ("REDIS_WAIT_TIMEOUT_MS", "600")])
def test_bad_values_fail_naming_the_variable(name, value, monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)  # REDIS_CLUSTER without a URL is the bad value
    with pytest.raises(ConfigurationError) as caught:
        load_settings({name: value})
    assert name in str(caught.value)
