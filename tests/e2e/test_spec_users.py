"""The spec owns auth.users: a user deleted from it loses access at the next `kit up`."""

import pytest
import yaml

from tests.support.live_stack import LiveSite, write_spec

pytestmark = pytest.mark.e2e


def test_a_user_dropped_from_the_spec_gets_401_after_kit_up(
    tmp_path, docker_client, test_images, free_port, cleanup_project
) -> None:
    site = LiveSite.create(tmp_path / "site", docker_client, free_port(), free_port(),
                       prefix="users", users=("ops", "bob"))
    cleanup_project(site.name)
    site.up()
    assert site.status(credentials=site.basic("bob")) == 200

    spec = yaml.safe_load(site.spec_path.read_text())
    spec["auth"]["users"] = ["ops"]
    write_spec(site.spec_path, spec)
    up = site.kit("up")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "removed user bob: no longer in auth.users" in up.stdout
    assert site.status(credentials=site.basic("bob")) == 401
    assert site.completion(site.basic("bob")) == 401
    assert site.status(credentials=site.basic("ops")) == 200
