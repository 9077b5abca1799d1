"""Settings.from_env: the environment's text parsed into typed, bounded settings."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from functions.settings import Settings, SettingsError


def test_defaults_without_environment() -> None:
    settings = Settings.from_env({})
    assert (settings.storage, settings.load_concurrency, settings.engine_timeout) == ("filer", 10, 30.0)
    assert settings.webhook_token is None and settings.broker_url is None


def test_numbers_and_fallbacks_are_read() -> None:
    settings = Settings.from_env(
        {
            "LORAFLOW_LOAD_CONCURRENCY": "4",
            "LORAFLOW_ENGINE_TIMEOUT": "2.5",
            "LORAFLOW_STORAGE": "s3",
            "K_SINK": "http://broker.example/ns/default",
            "KUBECONFIG": "/tmp/kubeconfig",
            "LORAFLOW_FILER_URL": "",  # empty is unset, as Knative renders an absent value
        }
    )
    assert (settings.load_concurrency, settings.engine_timeout, settings.storage) == (4, 2.5, "s3")
    assert settings.broker_url == "http://broker.example/ns/default"
    assert settings.kubeconfig == "/tmp/kubeconfig"
    assert settings.filer_url == "http://seaweedfs-filer.seaweedfs:8888"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        (
            {"LORAFLOW_LOAD_CONCURRENCY": "ten"},
            "LORAFLOW_LOAD_CONCURRENCY: Input should be a valid integer, unable to parse string",
        ),
        (
            {"LORAFLOW_LOAD_CONCURRENCY": "0"},
            "LORAFLOW_LOAD_CONCURRENCY: Input should be greater than or equal to 1",
        ),
        ({"LORAFLOW_ENGINE_TIMEOUT": "0"}, "LORAFLOW_ENGINE_TIMEOUT: Input should be greater than 0"),
        ({"LORAFLOW_STORAGE": "nfs"}, "LORAFLOW_STORAGE: Input should be 'filer' or 's3'"),
        (
            {"LORAFLOW_FILER_PAGE_SIZE": "1e3"},
            "LORAFLOW_FILER_PAGE_SIZE: Input should be a valid integer",
        ),
    ],
)
def test_bad_values_are_refused_by_name(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(env)
    assert named in str(caught.value)


def test_every_bad_value_is_named_and_none_is_shown() -> None:
    env = {
        "LORAFLOW_LOAD_CONCURRENCY": "0",
        "LORAFLOW_MAX_LORA_RANK": "many",
        "LORAFLOW_WEBHOOK_TOKEN": "s3cr3t",
    }
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(env)
    message = str(caught.value)
    assert "LORAFLOW_LOAD_CONCURRENCY" in message and "LORAFLOW_MAX_LORA_RANK" in message
    assert "many" not in message and "s3cr3t" not in message


def test_the_webhook_token_stays_out_of_repr() -> None:
    settings = Settings.from_env({"LORAFLOW_WEBHOOK_TOKEN": "s3cr3t"})
    assert settings.webhook_token is not None and settings.webhook_token.get_secret_value() == "s3cr3t"
    assert "s3cr3t" not in repr(settings) and "s3cr3t" not in str(settings)
    assert "webhook_token=SecretStr('**********')" in repr(settings)
    assert "s3cr3t" not in settings.model_dump_json()


def test_built_in_code_without_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests and tools build Settings directly; the process environment is not read."""
    monkeypatch.setitem(os.environ, "LORAFLOW_LOAD_CONCURRENCY", "7")
    assert Settings(load_concurrency=3).load_concurrency == 3
    assert Settings().load_concurrency == 10
    assert Settings.from_env({}).load_concurrency == 10
    assert Settings.from_env().load_concurrency == 7


def test_settings_are_immutable_and_refuse_unknown_names() -> None:
    settings = Settings()
    with pytest.raises(ValidationError, match="frozen"):
        settings.load_concurrency = 2  # type: ignore[misc]
    with pytest.raises(ValidationError, match="load_concurency"):
        Settings(load_concurency=2)  # type: ignore[call-arg]


def test_our_variable_wins_over_the_fallback() -> None:
    env = {"K_SINK": "http://sink", "LORAFLOW_BROKER_URL": "http://ours", "KUBECONFIG": "/k"}
    settings = Settings.from_env(env)
    assert (settings.broker_url, settings.kubeconfig) == ("http://ours", "/k")


def test_the_stack_takes_its_storage_backend_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """`LORAFLOW_STORAGE=s3 make serve`: the stack reads the variable the functions read."""
    from devstack.stack import storage_from_env

    monkeypatch.delenv("LORAFLOW_STORAGE", raising=False)
    assert storage_from_env() == "filer"
    monkeypatch.setenv("LORAFLOW_STORAGE", "s3")
    assert storage_from_env() == "s3"
    monkeypatch.setenv("LORAFLOW_STORAGE", "gcs")
    with pytest.raises(ValueError, match="gcs"):
        storage_from_env()
