"""Before a run: the HTTP client's settings, the key's header, which server answers at an endpoint (probed once
per server root) and which model it serves when none was named."""
from __future__ import annotations

import httpx

from engine.endpoint import servers
from engine.endpoint.config import Endpoint
from engine.endpoint.errors import EndpointError

_probed: dict[str, tuple[str, str | None]] = {}  # server root -> (server name, version)
_models: dict[str, str] = {}  # base URL -> the first model it lists


def headers(ep: Endpoint) -> dict:
    h = {"Accept": "text/event-stream"}
    if ep.api_key:
        h["Authorization"] = f"Bearer {ep.api_key}"
    return h


def http_client(ep: Endpoint) -> httpx.Client:
    # trust_env=False: no proxy from the environment sees the prompt or the key; no redirects: a configured
    # endpoint must not send the app to another address
    return httpx.Client(trust_env=False, follow_redirects=False, timeout=httpx.Timeout(
        ep.stall_s, connect=ep.connect_s))


def _get_json(client: httpx.Client, url: str, ep: Endpoint):
    try:
        r = client.get(url, headers=headers(ep))
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    try:
        return r.json()
    except ValueError:
        return None


def detect(ep: Endpoint, client: httpx.Client) -> tuple[str, str | None]:
    """(server name, version): the configured one, or the first whose probe answers (once per server root)."""
    if ep.server != servers.AUTO:
        fields = servers.server(ep.server)
        if fields.probe and (body := _get_json(client, ep.root + fields.probe[0], ep)) is not None:
            return ep.server, str(servers.lookup(body, fields.version) or "") or None
        return ep.server, None
    if ep.root not in _probed:
        found = (servers.GENERIC, None)
        for fields in servers.SERVERS.values():
            if fields.probe and isinstance(body := _get_json(client, ep.root + fields.probe[0], ep), dict) \
                    and fields.probe[1] in body:
                found = (fields.name, str(servers.lookup(body, fields.version) or "") or None)
                break
        _probed[ep.root] = found
    return _probed[ep.root]


def resolve_model(ep: Endpoint, client: httpx.Client) -> str:
    if ep.model:
        return ep.model
    if ep.url not in _models:
        body = _get_json(client, ep.url + "/models", ep)
        name = servers.lookup(body, "data.0.id") if isinstance(body, dict) else None
        if not name:
            raise EndpointError(f"no model was named and {ep.url}/models lists none; give the model's name")
        _models[ep.url] = str(name)
    return _models[ep.url]
