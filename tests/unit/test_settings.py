"""Settings.from_env: the environment's text parsed into typed, bounded settings."""

from __future__ import annotations

import pytest

from events.records import Invalid
from functions.settings import Settings


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
        ({"LORAFLOW_LOAD_CONCURRENCY": "ten"}, "LORAFLOW_LOAD_CONCURRENCY: 'ten' is not a number"),
        ({"LORAFLOW_LOAD_CONCURRENCY": "0"}, "load_concurrency: Input should be greater than or equal to 1"),
        ({"LORAFLOW_ENGINE_TIMEOUT": "0"}, "engine_timeout: Input should be greater than 0"),
        ({"LORAFLOW_STORAGE": "nfs"}, "storage: Input should be 'filer' or 's3'"),
    ],
)
def test_bad_values_are_refused_by_name(env: dict[str, str], named: str) -> None:
    with pytest.raises(Invalid) as caught:
        Settings.from_env(env)
    assert named in str(caught.value)


def test_the_webhook_token_stays_out_of_repr() -> None:
    settings = Settings.from_env({"LORAFLOW_WEBHOOK_TOKEN": "s3cr3t"})
    assert settings.webhook_token == "s3cr3t"
    assert "s3cr3t" not in repr(settings) and "webhook_token='**********'" in repr(settings)
