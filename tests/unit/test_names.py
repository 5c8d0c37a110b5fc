"""kit.names: every pattern matches a whole value (a final newline is not its end), hosts carry
no IPv6 zone id, and sizes come out in units every nginx size directive reads."""

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from kit import names
from kit.spec.model import Service

# One ordinary value per pattern of kit.names (a test below proves the table covers them all).
EXAMPLES = {
    "SITE_NAME": "prod-1",
    "SERVICE_NAME": "llama8b",
    "SERVED_NAME": "org/model:v1.2",
    "MODEL_REF": "Qwen/Qwen2.5-7B-Instruct",
    "REVISION": "v2.1_rc-1",
    "COMMIT": "a09a35458c702b33eeacc393d103063234e8bc28",
    "SHA256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "USER_NAME": "ops.team_1",
    "IMAGE_REF": "vllm/vllm-openai:v0.33.0",
    "ENV_NAME": "HF_HUB_OFFLINE",
    "ENV_VALUE": "--flag={\"json\": true}",
    "SIZE": "512k",
    "ACME_SERVER": "https://acme.example.com/directory",
    "EMAIL": "ops@example.com",
    "PATH_TEXT": "/data/models",
    "HOSTNAME_LABEL": "llm",
    "INTERFACE_NAME": "ens5f0",
    "K8S_NAME": "llama8b-env",
    "SSH_USER": "deploy_1",
    "HEADER_NAME": "X-Session-ID",
    "SMTP_USER": "alerts+kit@example.com",
}


def test_the_examples_cover_every_pattern() -> None:
    patterns = {name for name, value in vars(names).items()
                if name.isupper() and isinstance(value, str)}
    assert patterns == set(EXAMPLES)


@pytest.mark.parametrize("pattern", sorted(EXAMPLES))
def test_a_pattern_matches_the_whole_value_only(pattern: str) -> None:
    regex, value = getattr(names, pattern), EXAMPLES[pattern]
    assert names.is_name(regex, value)
    for bad in (value + "\n", "\n" + value, value + "\r\n", value + "\x00"):
        assert not names.is_name(regex, bad), repr(bad)
    assert re.match(regex, value + "\n") is not None  # why: Python's `$` ends before a newline


def test_pydantic_patterns_end_at_the_end_of_the_text() -> None:
    """pydantic 2's Rust regex engine reads `$` as end of text: the spec refuses `name\\n`."""
    with pytest.raises(ValidationError, match="pattern"):
        Service.model_validate({"name": "llama\n", "model": "m", "gpus": [0]})


@pytest.mark.parametrize(
    ("value", "expected"),
    [("LLM.Example.COM.", "llm.example.com"), ("10.0.0.1", "10.0.0.1"), ("::1", "::1"),
     ("2001:DB8::1", "2001:db8::1"), ("llm", "llm")],
)
def test_host_accepts_names_and_addresses(value: str, expected: str) -> None:
    assert names.host(value) == expected


@pytest.mark.parametrize(
    "value",
    ["::1%x; location ~ chat { js_content kit.route; } #", "fe80::1%$kit_auth_epoch",
     "fe80::1%eth0", "llm.example.com\n", "llm example.com", "-llm.example.com",
     "llm-.example.com", "a" * 64 + ".com", "", "llm..com", "llm.example.com;", "ЛЛМ.рф"],
)
def test_host_refuses_everything_else(value: str) -> None:
    with pytest.raises(ValueError, match="not a DNS name or IP address"):
        names.host(value)


@pytest.mark.parametrize("value", ["fe80::1%eth0", "::%0", "0.0.0.0\n", "localhost", "1.2.3"])
def test_ip_refuses_zones_and_names(value: str) -> None:
    with pytest.raises(ValueError, match="not an IP address"):
        names.ip(value)


@pytest.mark.parametrize(
    ("size", "nginx"),
    [("1g", "1024m"), ("1m", "1m"), ("512k", "512k"), ("1048576k", "1024m"), ("1500", "1500"),
     ("2048", "2k")],
)
def test_sizes_come_out_in_units_nginx_size_slots_read(size: str, nginx: str) -> None:
    assert names.is_name(names.SIZE, size)
    assert names.nginx_size(names.size_bytes(size)) == nginx


def test_paths_refuse_what_a_compose_bind_mount_cannot_hold() -> None:
    for bad in ("/data/with space", "/data:rw", "/data,x", "/data/$HOME", "relative"):
        assert not names.is_name(names.PATH_TEXT, str(Path(bad))), bad


@pytest.mark.parametrize("address", ["--staging@x.zz", "-v@example.com", ".ops@example.com",
                                     "ops@-example.com", "ops@example-.com", "ops@example",
                                     "ops @example.com", "ops@exa_mple.com"])
def test_an_email_that_certbot_would_read_as_an_option_or_not_an_address_is_refused(
    address: str,
) -> None:
    """tls.email reaches certbot's --email: an address starting with '-' would be parsed as
    options on every run (issue 22 item 8)."""
    assert not names.is_name(names.EMAIL, address)
    assert names.is_name(names.EMAIL, "ops.team+kit@mail.example-corp.com")
