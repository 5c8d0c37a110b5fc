"""The front door's rendered facts, without Docker: limits, routes, what may enter nginx.conf."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from kit.errors import BadInput
from kit.plan.build import build_plan
from kit.plan.host import load_spec
from kit.render.site_files import comment, nginx_string, nginx_token, render_site, routes_table
from kit.site import Site
from tests.support.nginx_structure import parse


def plan_with(site: Path, proxy: str = ""):
    spec = site / "site.yaml"
    if proxy:
        text = spec.read_text()
        spec.write_text(text.replace("read_timeout: 900}", f"read_timeout: 900, {proxy}}}"))
    return build_plan(load_spec(spec))


def test_auto_limits_let_one_address_use_every_stream_slot(site: Path) -> None:
    nginx = plan_with(site).nginx  # one service, max_num_seqs 64
    assert nginx.rate_per_ip == nginx.rate_per_credential == 64 * 60
    assert nginx.max_connections_per_ip == 2 * 64
    assert nginx.retry_after == 1


def test_limits_set_to_numbers_are_kept(site: Path) -> None:
    nginx = plan_with(site, "rate_limit_per_ip: 30, rate_limit_per_credential: 20, "
                            "max_connections_per_ip: 7").nginx
    assert (nginx.rate_per_ip, nginx.rate_per_credential, nginx.max_connections_per_ip) == (
        30, 20, 7)
    assert nginx.retry_after == 3  # one request's worth of the smaller rate


@pytest.mark.parametrize("proxy", ["rate_limit_per_ip: fast", "max_connections_per_ip: 70000",
                                   "rate_limit_per_credential: 0"])
def test_limits_that_are_neither_auto_nor_in_range_are_refused(site: Path, proxy: str) -> None:
    with pytest.raises(BadInput):
        plan_with(site, proxy)


def test_the_rendered_limits_and_verifier(site: Path) -> None:
    render_site(Site.load(site / "site.yaml"))
    conf = (site / "nginx" / "nginx.conf").read_text()
    assert "rate=3840r/m;" in conf and "limit_conn kit_conn_per_ip 128;" in conf
    assert "server kit-auth:8081" in conf and "auth_basic " not in conf  # no bcrypt in here
    for line in ("proxy_cache_use_stale updating;", "proxy_cache_background_update on;",
                 "add_header Retry-After 1 always;", "error_page 429 = @kit_rate_limited;"):
        assert line in conf, line
    verifier = (site / "nginx" / "verifier" / "nginx.conf").read_text()
    assert "auth_basic_user_file /etc/nginx/kit-auth/htpasswd;" in verifier
    assert "rate=20r/m;" in verifier and "error_page 401 = @kit_failed;" in verifier


def test_routes_are_json_whatever_the_names_hold() -> None:
    names = {"llama-3.1-8b": "llama8b", "Org/Model:v2": "big", 'a"b\\c</x>$y': "odd"}
    plan = SimpleNamespace(services=[SimpleNamespace(api_name=k, name=v, adapters=())
                                     for k, v in names.items()])
    assert json.loads(routes_table(plan)) == names


@pytest.mark.parametrize("value", ["llm.example.com", "10.1.2.3", "small-b", "/var/www/acme",
                                   "[::1]"])
def test_plain_values_pass_as_nginx_words(value: str) -> None:
    assert nginx_token(value) == value


@pytest.mark.parametrize("value", ["a;b", "a b", "$kit_auth_epoch", "x}", "x{", "a#b", "", "a\n",
                                   "'q'", '"q"'])
def test_values_that_could_change_the_config_are_refused(value: str) -> None:
    with pytest.raises(BadInput):
        nginx_token(value)


def test_nginx_strings_are_quoted_and_escaped() -> None:
    assert nginx_string('Basic realm="x"') == '"Basic realm=\\"x\\""'
    assert nginx_string("a\\b") == '"a\\\\b"'
    for value in ("$host", "line\nbreak", "tab\there"):
        with pytest.raises(BadInput):
            nginx_string(value)


def test_a_spec_file_name_cannot_leave_the_comment_it_is_quoted_in() -> None:
    assert comment("site.yaml") == "site.yaml"
    assert comment("a\nserver { listen 1; }\r.yaml") == "a?server { listen 1; }?.yaml"


def test_an_ipv6_domain_is_bracketed_where_it_stands_in_a_url(site: Path) -> None:
    spec = site / "site.yaml"
    spec.write_text(re.sub(r"(?m)^domain: .*$", 'domain: "fd00::5"', spec.read_text()))
    render_site(Site.load(spec))
    http = parse((site / "nginx" / "nginx.conf").read_text()).one("http")
    plain = next(s for s in http.find("server") if ("80", "default_server") in s.values("listen"))
    assert plain.one("location", "/").values("return") == [
        ("301", "https://[fd00::5]:8443$request_uri")]
