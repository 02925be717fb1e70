"""A Hugging Face hub on loopback, for pulling without the internet (point HF_ENDPOINT at `FakeHub.url`).

It answers exactly what huggingface_hub asks while llamacy pulls:
- GET  /api/models/{repo}/revision/{rev}?blobs=True   model_info(files_metadata=True): commit + siblings
  with size, git blob id and LFS metadata (sha256, size);
- HEAD /{repo}/resolve/{rev}/{file}                    get_hf_file_metadata (also inside hf_hub_download):
  LFS files answer 302 to a CDN URL with X-Repo-Commit, X-Linked-Etag (the sha256), X-Linked-Size;
  files kept in git answer 200 with ETag (the git blob id) and Content-Length;
- GET  /{repo}/resolve/{rev}/{file}                    the same redirect, or the bytes;
- GET  /cdn/{repo}/{sha256}                             the bytes, honouring `Range: bytes=N-` (206).
Errors carry the X-Error-Code header huggingface_hub maps to its exceptions (RepoNotFound, ...).

Faults, per file, to test what a pull does when the network or the hub misbehaves: drop the connection
after some bytes (a number of times, or always), serve a corrupted or truncated file, trickle slowly,
or ignore Range requests.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class HubFile:
    data: bytes
    lfs: bool = True
    drop_after: int | None = None  # close the connection after sending this many body bytes ...
    drops: int = 0  # ... on this many GETs (-1: on every one)
    corrupt: bool = False  # flip a byte in the middle of what is served (the sizes stay right)
    serve_bytes: int | None = None  # serve a truncated file, this long, with a matching Content-Length
    rate: int | None = None  # bytes per second, to interrupt a pull mid-way
    ranges: bool = True  # False: answer a Range request with the whole file (200), as some CDNs do

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_id(self) -> str:
        body = (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {len(self.data)}\n"
        )
        content = body.encode() if self.lfs else self.data
        return hashlib.sha1(f"blob {len(content)}\0".encode() + content).hexdigest()

    def served(self) -> bytes:
        data = self.data
        if self.corrupt:
            mid = len(data) // 2
            data = data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1 :]
        if self.serve_bytes is not None:
            data = data[: self.serve_bytes]
        return data


@dataclass
class Repo:
    files: dict[str, HubFile]
    commit: str = field(default="")
    token: str | None = None  # private: only `Authorization: Bearer <token>` sees it
    gated: bool = False  # with a token: terms to accept first


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.lock = threading.Lock()
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        # Two servers, as on the real hub: the API and resolve URLs, and a CDN on another host (here, port)
        # that LFS files redirect to; huggingface_hub follows redirects only within the hub.
        self.servers = [ThreadingHTTPServer(("127.0.0.1", 0), Handler) for _ in range(2)]
        for server in self.servers:
            server.daemon_threads = True
        self.url, self.cdn_url = (f"http://127.0.0.1:{s.server_address[1]}" for s in self.servers)

    def add(
        self, repo_id: str, files: dict[str, bytes | HubFile], token: str | None = None, gated: bool = False
    ) -> Repo:
        repo = Repo(
            {k: v if isinstance(v, HubFile) else HubFile(v) for k, v in files.items()}, "", token, gated
        )
        digest = hashlib.sha1(repo_id.encode())
        for name in sorted(repo.files):
            digest.update(name.encode() + repo.files[name].sha256.encode())
        repo.commit = digest.hexdigest()  # a new commit whenever the files change
        self.repos[repo_id] = repo
        return repo

    def file(self, repo_id: str, sha256: str) -> HubFile | None:
        repo = self.repos.get(repo_id)
        return next((f for f in repo.files.values() if f.sha256 == sha256), None) if repo else None

    def ranges(self, path_suffix: str) -> list[str | None]:
        """The Range headers of the GETs of a CDN path ending in `path_suffix`."""
        return [r for m, p, r in self.requests if m == "GET" and p.endswith(path_suffix)]

    def start(self) -> FakeHub:
        for server in self.servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj: object) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def _route(self) -> None:
        path = unquote(urlsplit(self.path).path)
        with self.hub.lock:
            self.hub.requests.append((self.command, path, self.headers.get("Range")))
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path):
            return self._model_info(m.group(1), m.group(2))
        if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            return self._resolve(m.group(1), m.group(2), m.group(3))
        if m := re.fullmatch(r"/cdn/([^/]+/[^/]+)/([0-9a-f]{64})", path):
            f = self.hub.file(m.group(1), m.group(2))
            if f is None:
                return self._error(404, "EntryNotFound", "no such blob")
            return self._send_bytes(f)
        self._error(404, "RepoNotFound", "not found")

    def _repo(self, repo_id: str, rev: str) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if repo.token is not None and self.headers.get("Authorization") != f"Bearer {repo.token}":
            # What the hub says to a client without the right token: the repository does not exist.
            self._error(401, "RepoNotFound", "Invalid username or password.")
            return None
        if repo.gated:
            self._error(403, "GatedRepo", "Access to this model is restricted.")
            return None
        if rev not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", "Invalid rev id")
            return None
        return repo

    def _model_info(self, repo_id: str, rev: str) -> None:
        repo = self._repo(repo_id, rev)
        if repo is None:
            return
        siblings = []
        for name, f in sorted(repo.files.items()):
            s: dict = {"rfilename": name, "size": len(f.data), "blobId": f.git_id}
            if f.lfs:
                s["lfs"] = {"sha256": f.sha256, "size": len(f.data), "pointerSize": 134}
            siblings.append(s)
        self._json(
            {
                "_id": repo.commit[:24],
                "id": repo_id,
                "modelId": repo_id,
                "sha": repo.commit,
                "private": False,
                "gated": False,
                "disabled": False,
                "tags": ["gguf"],
                "siblings": siblings,
            }
        )

    def _resolve(self, repo_id: str, rev: str, name: str) -> None:
        repo = self._repo(repo_id, rev)
        if repo is None:
            return
        f = repo.files.get(name)
        if f is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if not f.lfs:
            return self._send_bytes(f, {"ETag": f'"{f.git_id}"', "X-Repo-Commit": repo.commit})
        self.send_response(302)
        self.send_header("Location", f"{self.hub.cdn_url}/cdn/{repo_id}/{f.sha256}")
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{f.git_id}"')
        self.send_header("X-Linked-Etag", f'"{f.sha256}"')
        self.send_header("X-Linked-Size", str(len(f.data)))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _send_bytes(self, f: HubFile, headers: dict[str, str] | None = None) -> None:
        data = f.served()
        start = 0
        rng = self.headers.get("Range")
        if rng and f.ranges and (m := re.fullmatch(r"bytes=(\d+)-", rng.strip())):
            start = int(m.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if self.command == "HEAD":
            return
        body = data[start:]
        limit = len(body)
        if f.drop_after is not None and f.drops != 0 and self.command == "GET":
            limit = min(limit, max(f.drop_after - start, 0))
            if f.drops > 0:
                f.drops -= 1
        step = 64 * 1024
        for i in range(0, limit, step):
            chunk = body[i : min(i + step, limit)]
            self.wfile.write(chunk)
            if f.rate:
                self.wfile.flush()
                time.sleep(len(chunk) / f.rate)
        if limit < len(body):
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)  # mid-body: the client sees the connection drop
