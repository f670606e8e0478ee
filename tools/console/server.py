"""The console's HTTP side: the standard library's ThreadingHTTPServer on
127.0.0.1, one thread per request, GET for pages and POST (an URL-encoded
form) for actions, dispatched by path to ``pages.GET`` / ``pages.POST``.

Each request gets its own ``AdminClient`` (closed when the page is
written), so requests share no connection and need no lock; only the
sampler's TPS rings are shared. Every answer is a whole HTML page: a
page function's result (200); its ``BadInput`` or ``AdminError`` as the
sentence in a red box (400), a refused action's on the page of its form
(``pages.BACK``); an unknown path (404) or method (405) said
so. A bug is logged with its traceback on the console's stderr and the
page says only that the request failed and where to look (500): never a
traceback page. It listens on 127.0.0.1 only: the console has no login,
and its forms delete topics and move offsets. For the same reason a
request must name this console in its Host header (a page of another site
that a DNS name rebound to 127.0.0.1 would not), and a POST whose Origin
is another site's (a form of that site submitted in the user's browser)
is refused (403).
"""
from __future__ import annotations

import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from ..admin_client import AdminClient, AdminError
from . import pages
from .html import page
from .sampler import Sampler

FORM_BYTES_MAX = 1 << 20       # a POST body larger than this is refused (413)

log = logging.getLogger("shmq.console")


class Console(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, namesrv: str, timeout: float, credentials, interval_s: float):
        self.namesrv, self.timeout, self.credentials = namesrv, timeout, credentials
        self.sampler = Sampler(self.client(), interval_s)
        super().__init__(("127.0.0.1", port), Handler)

    def client(self) -> AdminClient:
        return AdminClient(self.namesrv, self.timeout, self.credentials)

    def serve(self) -> None:
        self.sampler.start()
        try:
            self.serve_forever(poll_interval=0.5)
        finally:
            self.sampler.stop()
            self.server_close()


def _fields(text: str) -> dict[str, str]:
    """A query string or form body → field → its last value."""
    return {k: v[-1] for k, v in parse_qs(text, keep_blank_values=True).items()}


class Handler(BaseHTTPRequestHandler):
    server: Console
    server_version = "shmq-console"
    timeout = 30          # a connection that never sends its request does not keep a thread

    def _own(self) -> set[str]:
        port = self.server.server_address[1]
        return {f"127.0.0.1:{port}", f"localhost:{port}"}

    def _refused(self, post: bool) -> bool:
        """Another site's request (see the module's docstring): answered 403."""
        own = self._own()
        origin = self.headers.get("Origin")
        why = None
        if self.headers.get("Host") not in own:
            why = f"Host {self.headers.get('Host')!r} is not this console"
        elif post and origin is not None and origin.removeprefix("http://") not in own:
            why = f"a form from {origin} may not act on this console"
        if why:
            self._send(403, page("Refused", "", self.server.namesrv, error=why))
        return why is not None

    def do_GET(self) -> None:
        if self._refused(post=False):
            return
        url = urlsplit(self.path)
        self._answer(pages.GET, url.path, _fields(url.query))

    def do_POST(self) -> None:
        if self._refused(post=True):
            return
        url = urlsplit(self.path)
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = -1
        if not 0 <= n <= FORM_BYTES_MAX:
            return self._send(413, page("Error", "", self.server.namesrv,
                                        error=f"a form of at most {FORM_BYTES_MAX} bytes, please"))
        form = _fields(self.rfile.read(n).decode("utf-8", "replace"))
        self._answer(pages.POST, url.path, form)

    def _answer(self, routes: dict, path: str, fields: dict) -> None:
        ns = self.server.namesrv
        fn = routes.get(path)
        if fn is None:
            other = pages.POST if routes is pages.GET else pages.GET
            if path in other:
                return self._send(405, page("Error", "", ns, error=f"{path} takes a "
                                            f"{'POST' if other is pages.POST else 'GET'}"))
            return self._send(404, page("Not found", "", ns, error=f"no page {path}"))
        try:
            with self.server.client() as a:
                title, body, notice = fn(self.server, a, fields)
            self._send(200, page(title, body, ns, notice=notice))
        except pages.Failed as e:
            self._send(400, page(e.title, e.body, ns, error=str(e)))
        except (pages.BadInput, AdminError) as e:
            self._send(400, self._error_page(path, fields, str(e)))
        except Exception:
            log.exception("console: %s %s failed", self.command, self.path)
            self._send(500, page("Error", "", ns, error=f"{self.command} {path} failed: a bug in "
                                 f"the console; its traceback is on the console's stderr"))

    def _error_page(self, path: str, fields: dict, error: str) -> str:
        """A refused action's error on the page of its form (as it is now),
        so the user corrects the form there; else on a page of its own."""
        ns = self.server.namesrv
        if path in pages.BACK:
            back, names = pages.BACK[path]
            try:
                with self.server.client() as a:
                    title, body, _ = pages.GET[back](self.server, a,
                                                     {k: fields.get(k, "") for k in names})
                return page(title, body, ns, error=error)
            except (pages.BadInput, pages.Failed, AdminError):
                pass                  # the form's page is gone too (a deleted topic)
        return page(path.strip("/").replace("/", " ").capitalize() or "Cluster", "", ns,
                    error=error)

    def _send(self, status: int, text: str) -> None:
        data = text.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt: str, *args) -> None:
        log.debug("console: " + fmt, *args)

