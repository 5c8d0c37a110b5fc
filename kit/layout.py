"""Where everything lives in a site folder: one place, so no module guesses a path.

    <site>/site.yaml                    the spec (any name)
    <site>/compose/docker-compose.yml   rendered
    <site>/compose/<service>.env        rendered: each service's environment (0600: may hold tokens)
    <site>/compose/prometheus-auth.env  Prometheus's API password, for it and Grafana (0600)
    <site>/nginx/nginx.conf, *.js       rendered: the door and its njs modules (read-only at
                                        /etc/nginx/kit)
    <site>/nginx/kit-routes.json        rendered: served model name → the service that serves it
    <site>/nginx/verifier/nginx.conf    rendered: the password verifier (its own container),
                                        verifier.js and unknown-user.htpasswd (unknown names)
    <site>/nginx/replicas/<svc>.conf    a multi-replica service's servers (kit up marks one down)
    <site>/nginx/auth/                  htpasswd (bcrypt), keys.map (key digests), auth-state.conf,
                                        door-policy.json (per-credential policy the door enforces)
    <site>/nginx/tls/                   server.crt, server.key, ca.crt
    <site>/nginx/trust/ca-bundle.pem    tls.ca_bundle's copy (certbot's REQUESTS_CA_BUNDLE, gate)
    <site>/observability/               rendered when observability.enabled: prometheus/
                                        (prometheus.yml, rules.yml, web.yml: its API's
                                        bcrypt hash), grafana/provisioning/,
                                        grafana/dashboards/, door-figures/ (the door's counter),
                                        alertmanager/ (observability.alerts: its config, web.yml,
                                        secrets/ readable by its user only)
    <site>/compose/usage-models/        rendered: the model names the usage ledger records
    <site>/lora/<service>/adapters.yaml  rendered: a service's LoRA adapters as vLLM's --config
                                        file (mounted read-only at LORA_MOUNT in its replicas)
    <site>/site.lock                    the pinned models' commits and file hashes (`kit lock`)
    <site>/.kit/                        kit's state: manifest, CA key, probe identity, last probe,
                                        the usage ledger's anchors, the model files' hash cache
"""

from dataclasses import dataclass
from pathlib import Path

NGINX_MOUNT = "/etc/nginx/kit"  # where the nginx/ folder appears inside the nginx container
VERIFIER_MOUNT = "/etc/nginx/kit-verifier"  # nginx/verifier/ inside the verifier container
VERIFIER_AUTH_MOUNT = "/etc/nginx/kit-auth"  # nginx/auth/ there: auth_basic reads it per request
ACME_LAST_RUN = "acme-last-run"  # in nginx/tls, beside the certificate certbot installs
# A service's LoRA adapters folder inside its replicas: vLLM reads adapters.yaml from it at every
# start (`--config`); kit rewrites it when the adapters change and applies the change to the
# running replicas itself (kit adapters, kit up), so its content is not part of their identity.
LORA_MOUNT = "/etc/kit/lora"
# The model names the usage ledger's collector records (every name the door routes, adapters'
# too), inside its container: it reads the file again when it changes, so an adapter added
# recreates nothing and the folder's content is not part of the collector's identity.
USAGE_MODELS_MOUNT = "/etc/kit/usage-models"
LORA_CONFIG = "adapters.yaml"  # vLLM's --config takes .yaml / .yml only
PROBE_USER = "kit-probe"  # the dedicated identity the gate authenticates as
PROMETHEUS_WEB_CONFIG = "web.yml"  # in observability/prometheus/: its API's Basic auth (a hash)
PROMETHEUS_AUTH_ENV_FILE = "prometheus-auth.env"  # in compose/: the API's password, 0600
# in observability/prometheus/: the same password, which Prometheus sends Alertmanager's API
ALERTMANAGER_SECRET = "alertmanager.secret"


@dataclass(frozen=True)
class SiteLayout:
    root: Path

    @property
    def compose_dir(self) -> Path:
        return self.root / "compose"

    @property
    def compose_file(self) -> Path:
        return self.compose_dir / "docker-compose.yml"

    def env_file(self, service: str) -> Path:
        """A service's environment: kept out of the compose file, which anyone may read."""
        return self.compose_dir / f"{service}.env"

    @property
    def nginx_dir(self) -> Path:
        return self.root / "nginx"

    @property
    def nginx_conf(self) -> Path:
        return self.nginx_dir / "nginx.conf"

    @property
    def verifier_conf(self) -> Path:
        return self.nginx_dir / "verifier" / "nginx.conf"

    @property
    def verifier_js(self) -> Path:
        return self.nginx_dir / "verifier" / "verifier.js"

    @property
    def unknown_user_file(self) -> Path:
        """The verifier's htpasswd for names the real one does not hold (a dummy hash)."""
        return self.nginx_dir / "verifier" / "unknown-user.htpasswd"

    @property
    def routes_json(self) -> Path:
        return self.nginx_dir / "kit-routes.json"

    @property
    def auth_dir(self) -> Path:
        return self.nginx_dir / "auth"

    @property
    def htpasswd(self) -> Path:
        return self.auth_dir / "htpasswd"

    @property
    def keys_map(self) -> Path:
        return self.auth_dir / "keys.map"

    @property
    def auth_state(self) -> Path:
        return self.auth_dir / "auth-state.conf"

    @property
    def door_policy(self) -> Path:
        """What the front door enforces of each credential's policy (nginx preloads it for
        policy.js: docs/policy.md)."""
        return self.auth_dir / "door-policy.json"

    def lora_dir(self, service: str) -> Path:
        """A service's adapters folder (a folder is mounted, never the file: kit replaces the
        file by a rename, which a single-file bind would not show)."""
        return self.root / "lora" / service

    def lora_config(self, service: str) -> Path:
        return self.lora_dir(service) / LORA_CONFIG

    def replica_pool(self, service: str) -> Path:
        """The servers of a multi-replica service's upstreams (kit up marks one down while it
        replaces it; kit render writes every one in service)."""
        return self.nginx_dir / "replicas" / f"{service}.conf"

    @property
    def start_times(self) -> Path:
        """Seconds each service last took to become healthy (told before it goes down again)."""
        return self.state_dir / "start-times.json"

    @property
    def tls_dir(self) -> Path:
        return self.nginx_dir / "tls"

    @property
    def server_cert(self) -> Path:
        return self.tls_dir / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.tls_dir / "server.key"

    @property
    def acme_last_run(self) -> Path:
        """tls.mode acme: certbot's last run (exit code, time, output), written by its loop."""
        return self.tls_dir / ACME_LAST_RUN

    @property
    def ca_bundle(self) -> Path:
        """tls.ca_bundle copied into the site: mounted read-only into certbot, read by the gate."""
        return self.nginx_dir / "trust" / "ca-bundle.pem"

    @property
    def ca_cert(self) -> Path:
        return self.tls_dir / "ca.crt"

    @property
    def observability_dir(self) -> Path:
        return self.root / "observability"

    @property
    def prometheus_dir(self) -> Path:
        """Mounted whole into Prometheus (a file mount would pin the old inode on re-render)."""
        return self.observability_dir / "prometheus"

    @property
    def prometheus_web_config(self) -> Path:
        return self.prometheus_dir / PROMETHEUS_WEB_CONFIG

    @property
    def prometheus_auth_env(self) -> Path:
        return self.compose_dir / PROMETHEUS_AUTH_ENV_FILE

    @property
    def prometheus_password(self) -> Path:
        """The secret of Prometheus's API (0600), kept across renders: web.yml holds its hash."""
        return self.state_dir / "prometheus.password"

    @property
    def alertmanager_dir(self) -> Path:
        """observability.alerts: alertmanager.yml, web.yml and secrets/ (the receivers'), mounted
        whole into Alertmanager."""
        return self.observability_dir / "alertmanager"

    @property
    def alertmanager_web_config(self) -> Path:
        """Alertmanager's API asks for kit's account too: web.yml as Prometheus's."""
        return self.alertmanager_dir / PROMETHEUS_WEB_CONFIG

    @property
    def prometheus_alertmanager_secret(self) -> Path:
        return self.prometheus_dir / ALERTMANAGER_SECRET

    @property
    def grafana_provisioning_dir(self) -> Path:
        return self.observability_dir / "grafana" / "provisioning"

    @property
    def grafana_dashboards_dir(self) -> Path:
        return self.observability_dir / "grafana" / "dashboards"

    @property
    def door_figures_dir(self) -> Path:
        return self.observability_dir / "door-figures"

    @property
    def waker_dir(self) -> Path:
        """The waker's script (idle_sleep: docs/sleep.md), beside the compose file that binds it
        read-only."""
        return self.compose_dir / "waker"

    @property
    def usage_models_dir(self) -> Path:
        """The model names the usage ledger records (models.json), bound at USAGE_MODELS_MOUNT."""
        return self.compose_dir / "usage-models"

    @property
    def usage_dir(self) -> Path:
        """The usage ledger's collector script (a site file beside the compose file that binds
        it read-only)."""
        return self.compose_dir / "usage"

    @property
    def state_dir(self) -> Path:
        return self.root / ".kit"

    @property
    def lock_file(self) -> Path:
        """The pinned models' commits and file hashes, beside the spec (docs/weights.md)."""
        return self.root / "site.lock"

    @property
    def weights_hashes(self) -> Path:
        """The model files' sha256 by path and stat: a re-up does not read them again."""
        return self.state_dir / "weights-hashes.json"

    @property
    def ca_key(self) -> Path:
        return self.state_dir / "ca.key"

    @property
    def manifest(self) -> Path:
        return self.state_dir / "manifest.json"

    @property
    def spec_users(self) -> Path:
        """The auth.users of the last render: who the spec owns (removed from htpasswd when
        dropped from the spec), as opposed to users added with `kit users add`."""
        return self.state_dir / "spec-users.json"

    @property
    def new_passwords(self) -> Path:
        """Generated passwords not yet shown (0600): written with the htpasswd holding their
        hashes, deleted once printed, so a render that dies in between loses none."""
        return self.state_dir / "new-passwords.json"

    @property
    def probe_password(self) -> Path:
        return self.state_dir / "probe.password"

    @property
    def probe_hash(self) -> Path:
        """The htpasswd hash the probe password was installed with: proves they still match
        without a bcrypt check on every render."""
        return self.state_dir / "probe.hash"

    @property
    def last_probe(self) -> Path:
        return self.state_dir / "last-probe.json"

    @property
    def keys_db(self) -> Path:
        return self.state_dir / "keys.json"

    @property
    def policy_db(self) -> Path:
        """Each credential's policy as the operator set it (docs/policy.md)."""
        return self.state_dir / "policy.json"

    @property
    def usage_anchors(self) -> Path:
        """The usage ledger's heads each passing `kit audit verify` saw: a later verify finds
        each still in the chain, so a ledger rewritten from scratch does not pass."""
        return self.state_dir / "usage-anchors.json"

    @property
    def applied(self) -> Path:
        """What the running stack has loaded that its labels cannot say (nginx's config digest)."""
        return self.state_dir / "applied.json"
