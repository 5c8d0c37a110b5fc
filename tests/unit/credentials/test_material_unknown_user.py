"""An unknown Basic name costs what a known one costs (issue 22, item 3).

nginx's auth_basic runs bcrypt only for a name its htpasswd holds: a refusal of an unknown
name took 5 ms, of a known one with a wrong password 250 ms. The verifier now checks an unknown
name against a dummy hash of the same cost. Here: the dummy hash itself, and the rendered
verifier on the host's real nginx (private namespaces). The timing through the whole front door
is tests/e2e/test_auth_timing.py.
"""

import re
import statistics
from pathlib import Path

import bcrypt
import pytest

from kit.credentials.material import BCRYPT_COST, UNKNOWN_USER, UNKNOWN_USER_HASH
from kit.layout import SiteLayout
from kit.names import USER_NAME, is_name
from tests.support import nginx_ns
from tests.support.cli import run_kit


def test_the_dummy_hash_has_the_cost_of_every_password_hash() -> None:
    assert re.fullmatch(r"\$2b\$(\d\d)\$[./A-Za-z0-9]{53}", UNKNOWN_USER_HASH)
    assert int(UNKNOWN_USER_HASH.split("$")[2]) == BCRYPT_COST
    assert not bcrypt.checkpw(b"a guess", UNKNOWN_USER_HASH.encode())  # a hash bcrypt reads
    assert not is_name(USER_NAME, UNKNOWN_USER), "no user can be named like the dummy"


def test_the_verifier_renders_the_dummy_htpasswd(example_site: Path) -> None:
    assert run_kit("render", str(example_site / "site.yaml")).exit_code == 0
    layout = SiteLayout(example_site)
    assert layout.unknown_user_file.read_text() == f"{UNKNOWN_USER}:{UNKNOWN_USER_HASH}\n"
    conf = layout.verifier_conf.read_text()
    unknown = conf[conf.index("location = /verify-unknown {"):]
    unknown = unknown[:unknown.index("}")]
    assert "unknown-user.htpasswd;" in unknown
    assert "try_files /kit-none =401;" in unknown  # refused even if the dummy matched


# One request per line: status, seconds, the name. X-Kit-Client differs per request, so the
# failed-login budget (20 a minute per address) never cuts a check short.
CLIENT = """for i in 1 2 3 4 5 6; do
  for user in {known} nobody$i; do
    curl -s -o /dev/null -w "%{{http_code}} %{{time_total}} $user\\n" \\
      -u "$user:wrong-password-$i" -H "X-Kit-Client: 10.0.$i.1" http://127.0.0.1:8081/verify
  done
done
curl -s -o /dev/null -w "%{{http_code}} %{{time_total}} valid\\n" -u "{known}:{password}" \\
  -H "X-Kit-Client: 10.0.99.1" http://127.0.0.1:8081/verify
"""


@pytest.mark.real_bcrypt_cost  # the dummy's cost is the production one
def test_an_unknown_name_runs_one_bcrypt_check_like_a_known_one(example_site: Path) -> None:
    reason = nginx_ns.available()
    if reason:
        pytest.skip(reason)
    assert run_kit("render", str(example_site / "site.yaml")).exit_code == 0
    layout = SiteLayout(example_site)
    password = layout.probe_password.read_text().strip()
    served = nginx_ns.serve_verifier(layout.nginx_dir,
                                     CLIENT.format(known="kit-probe", password=password))
    assert served.returncode == 0, served.stderr
    replies = [line.split(" ") for line in served.stdout.splitlines() if line[:3].isdigit()]
    assert replies[-1][0] == "204", "the right password still passes"
    known = [float(seconds) for status, seconds, user in replies[:-1] if user == "kit-probe"]
    unknown = [float(seconds) for status, seconds, user in replies[:-1] if user != "kit-probe"]
    assert {status for status, _, _ in replies[:-1]} == {"401"} and len(unknown) == 6
    # bcrypt at cost 12 is tens to hundreds of ms; without it a refusal is about 1 ms.
    ratio = statistics.median(unknown) / statistics.median(known)
    print(f"median known {statistics.median(known) * 1000:.0f} ms, "
          f"unknown {statistics.median(unknown) * 1000:.0f} ms, ratio {ratio:.2f}")
    assert min(unknown) > 0.02 and 0.5 < ratio < 2
    # Each unknown name went to the dummy check: the verifier's log names it as the dummy user.
    checks = re.findall(r'^\S+ (\S+) \[[^]]+\] "GET (/verify\S*) ', served.stdout, re.M)
    assert checks.count((UNKNOWN_USER, "/verify-unknown")) == 6
    assert checks.count(("kit-probe", "/verify")) == 7
