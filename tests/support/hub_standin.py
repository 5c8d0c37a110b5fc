"""A local stand-in for the Hugging Face Hub, speaking the endpoints `huggingface_hub` uses
(read from the installed client's source, not copied): reached only through HF_ENDPOINT on
loopback.

- GET /api/models/<org>/<name>/revision/<rev>[?blobs=true]: model info (sha, siblings; with
  blobs, each file's size, blob id and, for LFS files, lfs.sha256/size/pointerSize);
- GET /api/models/<org>/<name>/tree/<rev>[/<path>]?recursive=…: the file listing;
- HEAD/GET /<org>/<name>/resolve/<rev>/<path>: X-Repo-Commit; a small file answers 200 with
  its git blob id as ETag and Content-Length; an LFS file answers 302 to a storage host (a
  second server on 127.0.0.2, as the Hub's CDN is another host) with X-Linked-Etag (its
  sha256) and X-Linked-Size; errors carry X-Error-Code (RepoNotFound, RevisionNotFound,
  EntryNotFound, GatedRepo) as the client expects;
- the storage host serves the bytes with Range requests (206, Content-Range).

With `token` set, the Hub side answers 401 without `Authorization: Bearer <token>`, and every
request is recorded (`requests`) so a test can prove the storage host never saw the token and
that a re-run asked for a Range; `served_bytes` counts the model bytes sent.
`bytes_per_second` throttles the storage host so a test can interrupt a pull half-way.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support.sites import REPO

LFS_MIN_BYTES = 1024  # files this size or larger are stored in LFS (as the Hub does for weights)
QWEN_CONFIG = REPO / "tests" / "data" / "models" / "qwen2.5-0.5b-instruct" / "config.json"


def git_blob_id(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def safetensors(tensors: dict[str, int], seed: int) -> bytes:
    """A valid safetensors file of F16 vectors of the given lengths (content from `seed`)."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, length in tensors.items():
        header[name] = {"dtype": "F16", "shape": [length], "data_offsets": [offset,
                                                                          offset + 2 * length]}
        offset += 2 * length
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    data = hashlib.shake_256(seed.to_bytes(8, "little")).digest(offset)
    return struct.pack("<Q", len(raw)) + raw + data


def small_model(shard_bytes: int = 1 << 20, seed: int = 1) -> dict[str, bytes]:
    """A small model repository: config, tokenizer, an index and two shards."""
    elements = max(1, shard_bytes // 2)
    shards = {f"model-0000{n}-of-00002.safetensors":
              safetensors({f"model.layer{n - 1}.weight": elements}, seed + n) for n in (1, 2)}
    index = {"metadata": {"total_size": 4 * elements}, "weight_map": {
        "model.layer0.weight": "model-00001-of-00002.safetensors",
        "model.layer1.weight": "model-00002-of-00002.safetensors"}}
    return {
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        "README.md": f"# a stand-in model (seed {seed})\n".encode(),
        "config.json": QWEN_CONFIG.read_bytes(),
        "generation_config.json": b'{"max_new_tokens": 64}\n',
        "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE", "vocab": {}, '
                          b'"merges": []}}\n',
        "tokenizer_config.json": b'{"chat_template": "{{ messages[0].content }}"}\n',
        "model.safetensors.index.json": json.dumps(index, indent=2).encode(),
        **shards,
    }


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]]  # commit → path → content
    refs: dict[str, str]  # branch or tag → commit
    gated: bool = False

    def commit_of(self, revision: str) -> str | None:
        if revision in self.commits:
            return revision
        return self.refs.get(revision)


@dataclass
class Seen:
    method: str
    host: str
    path: str
    headers: dict[str, str]


@dataclass
class HubStandin:
    repos: dict[str, Repo] = field(default_factory=dict)
    token: str | None = None
    bytes_per_second: float | None = None
    requests: list[Seen] = field(default_factory=list)
    blobs: dict[str, bytes] = field(default_factory=dict)  # the storage host's, by sha256
    served_bytes: int = 0  # bytes of model files sent (resolve bodies, storage bodies)

    def add(self, repo_id: str, files: dict[str, bytes], *, branch: str = "main") -> str:
        """A new commit of `repo_id` holding `files`, the branch moved to it; its id."""
        commit = hashlib.sha1(repo_id.encode() + json.dumps(
            {p: hashlib.sha256(c).hexdigest() for p, c in sorted(files.items())}).encode()
        ).hexdigest()
        repo = self.repos.setdefault(repo_id, Repo({}, {}))
        repo.commits[commit] = dict(files)
        self.blobs.update({hashlib.sha256(c).hexdigest(): c for c in files.values()
                           if len(c) >= LFS_MIN_BYTES})
        repo.refs[branch] = commit
        return commit

    def start(self, host: str = "127.0.0.1", storage_host: str = "127.0.0.2") -> HubStandin:
        """Listening on `host` (the Hub) and `storage_host` (its CDN; another address, or the
        same one on another port, is another host to the client)."""
        self.hub = _serve(self, host, storage=False)
        self.storage = _serve(self, storage_host, storage=True)
        return self

    @property
    def endpoint(self) -> str:
        return f"http://{self.hub.server_address[0]}:{self.hub.server_port}"

    @property
    def storage_url(self) -> str:
        return f"http://{self.storage.server_address[0]}:{self.storage.server_port}"

    def stop(self) -> None:
        for server in (self.hub, self.storage):
            server.shutdown()
            server.server_close()

    def blob(self, sha256: str) -> bytes | None:
        return self.blobs.get(sha256)


def _serve(hub: HubStandin, host: str, *, storage: bool) -> ThreadingHTTPServer:
    handler = type("Handler", (_StorageHandler if storage else _HubHandler,), {"hub": hub})
    server = ThreadingHTTPServer((host, 0), handler)
    server.daemon_threads = True
    # a client gone mid-request (an interrupted pull) is expected: no traceback on stderr
    server.handle_error = lambda request, address: None  # type: ignore[method-assign]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandin
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._record()
        self._answer()

    def do_GET(self) -> None:
        self._record()
        self._answer()

    def _answer(self) -> None:
        raise NotImplementedError

    def _record(self) -> None:
        self.hub.requests.append(Seen(self.command, self.headers.get("Host", ""), self.path,
                                      {k.lower(): v for k, v in self.headers.items()}))

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              *, length: int | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message,
                   "Content-Type": "application/json"}
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send(status, json.dumps({"error": message}).encode(), headers)


class _HubHandler(_Handler):
    def _answer(self) -> None:
        if self.hub.token and self.headers.get("Authorization") != f"Bearer {self.hub.token}":
            self._error(401, "RepoNotFound", "Invalid credentials in Authorization header")
            return
        url = urlsplit(self.path)
        api = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)(/.*)?", url.path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", url.path)
        match = api or resolve
        if match is None:
            self._error(404, "RepoNotFound", "no such route")
            return
        repo = self.hub.repos.get(unquote(match.group(1)))
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return
        if repo.gated and not self.hub.token:
            self._error(403, "GatedRepo", "Access to this model is restricted")
            return
        revision = unquote(match.group(3) if api else match.group(2))
        commit = repo.commit_of(revision)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return
        files = repo.commits[commit]
        if api and api.group(2) == "revision":
            blobs = parse_qs(url.query).get("blobs") == ["true"]
            self._json({"id": match.group(1), "sha": commit, "private": False,
                        "siblings": [_sibling(path, content, blobs)
                                     for path, content in sorted(files.items())]})
        elif api:
            under = unquote(api.group(4) or "").strip("/")
            self._json([_tree_entry(path, content) for path, content in sorted(files.items())
                        if not under or path.startswith(under + "/")])
        else:
            self._resolve(commit, files, unquote(match.group(3)))

    def _json(self, value: object) -> None:
        self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

    def _resolve(self, commit: str, files: dict[str, bytes], path: str) -> None:
        content = files.get(path)
        if content is None:
            self._error(404, "EntryNotFound", f"{path} does not exist", commit)
            return
        if len(content) < LFS_MIN_BYTES:
            if self.command == "GET":
                self.hub.served_bytes += len(content)
            self._send(200, content, {"X-Repo-Commit": commit,
                                      "ETag": f'"{git_blob_id(content)}"',
                                      "Content-Type": "application/octet-stream"})
            return
        sha = hashlib.sha256(content).hexdigest()
        self._send(302, b"", {"X-Repo-Commit": commit, "X-Linked-Etag": f'"{sha}"',
                              "X-Linked-Size": str(len(content)),
                              "ETag": f'"{git_blob_id(content)}"',
                              "Location": f"{self.hub.storage_url}/blobs/{sha}"})


class _StorageHandler(_Handler):
    def _answer(self) -> None:
        match = re.fullmatch(r"/blobs/([0-9a-f]{64})", urlsplit(self.path).path)
        content = self.hub.blob(match.group(1)) if match else None
        if content is None:
            self._send(404, b"no such blob")
            return
        start, end, status = 0, len(content) - 1, 200
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes",
                   "ETag": f'"{hashlib.sha256(content).hexdigest()}"'}
        if wanted:
            start = int(wanted.group(1))
            end = min(int(wanted.group(2) or end), end)
            if start > end:
                self._send(416, b"", {"Content-Range": f"bytes */{len(content)}"})
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
        body = content[start:end + 1]
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        step = 16 << 10
        for at in range(0, len(body), step):
            try:
                self.wfile.write(body[at:at + step])
                self.hub.served_bytes += len(body[at:at + step])
            except OSError:
                return  # the client went away (an interrupted pull)
            if self.hub.bytes_per_second:
                time.sleep(step / self.hub.bytes_per_second)


def _sibling(path: str, content: bytes, blobs: bool) -> dict:
    if not blobs:
        return {"rfilename": path}
    entry: dict = {"rfilename": path, "size": len(content), "blobId": git_blob_id(content)}
    if len(content) >= LFS_MIN_BYTES:
        entry["lfs"] = {"sha256": hashlib.sha256(content).hexdigest(), "size": len(content),
                        "pointerSize": 134}
    return entry


def _tree_entry(path: str, content: bytes) -> dict:
    entry: dict = {"type": "file", "oid": git_blob_id(content), "size": len(content),
                   "path": path}
    if len(content) >= LFS_MIN_BYTES:
        entry["lfs"] = {"oid": hashlib.sha256(content).hexdigest(), "size": len(content),
                        "pointerSize": 134}
    return entry


def write_files(folder: Path, files: dict[str, bytes]) -> None:
    for path, content in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(content)
