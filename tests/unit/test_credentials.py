"""connections.py: the plugin's profile fields, as dbt validates them from profiles.yml."""

from __future__ import annotations

import pytest
from dbt_common.dataclass_schema import ValidationError

from dbt.adapters.spark_ivm.connections import SparkIvmCredentials

THRIFT_PROFILE = {
    "method": "thrift",
    "host": "127.0.0.1",
    "port": 10000,
    "user": "dbt",
    "schema": "s",
}


def test_poll_interval_defaults_to_a_tenth_of_a_second():
    # dbt-spark's default of 5 s is paid on every statement still running at its first poll.
    SparkIvmCredentials.validate(THRIFT_PROFILE)
    assert SparkIvmCredentials.from_dict(THRIFT_PROFILE).poll_interval == 0.1


@pytest.mark.parametrize("seconds", [0.25, 2])
def test_poll_interval_takes_fractions_and_whole_seconds(seconds):
    profile = {**THRIFT_PROFILE, "poll_interval": seconds}
    SparkIvmCredentials.validate(profile)
    assert SparkIvmCredentials.from_dict(profile).poll_interval == seconds


def test_poll_interval_must_be_a_number():
    with pytest.raises(ValidationError, match="poll_interval|soon"):
        SparkIvmCredentials.validate({**THRIFT_PROFILE, "poll_interval": "soon"})


def test_reuse_connections_defaults_to_true_and_can_be_turned_off():
    assert SparkIvmCredentials.from_dict(THRIFT_PROFILE).reuse_connections is True
    profile = {**THRIFT_PROFILE, "reuse_connections": False}
    SparkIvmCredentials.validate(profile)
    assert SparkIvmCredentials.from_dict(profile).reuse_connections is False
