"""The notebook view of a vec env (``DaskVecEnv._repr_html_``): plain HTML, no widgets."""

from __future__ import annotations

from html import escape
from typing import Any

__all__ = ["notebook_html"]


def notebook_html(
    groups: list[dict[str, Any]], n_envs: int, link: str | None, page: str | None = None, problem: str | None = None
) -> str:
    """The notebook view of an open vec env: dashboard links, then one row per worker.

    ``link`` and ``page`` are the dashboard and daskvec page links to show (only pages
    the scheduler serves, see :func:`daskvec.monitoring.links.check_dashboard`);
    ``problem`` says why one is missing.
    """
    by_worker: dict[str, list[dict[str, Any]]] = {}
    for g in groups:
        by_worker.setdefault(g["worker"], []).append(g)
    if link:
        links = _anchor(link) + (
            f" (daskvec page: {_anchor(page)})" if page else f" (no daskvec page: {escape(problem or 'unknown')})"
        )
    else:
        links = f"not available: {escape(problem or 'unknown')}"
    rows = "".join(
        f"<tr><td style='text-align:left'>{escape(w)}</td><td>{sum(len(g['envs']) for g in gs)}</td>"
        f"<td>{len(gs)}</td><td style='text-align:left'>{escape(_ranges([i for g in gs for i in g['envs']]))}</td>"
        f"<td>{escape(', '.join(sorted({g['transport'] for g in gs})))}</td>"
        f"<td style='text-align:left'>{'<br>'.join(escape(_channel(g)) for g in gs)}</td></tr>"
        for w, gs in sorted(by_worker.items())
    )
    return (
        "<div>"
        f"<p><strong>DaskVecEnv</strong>: {n_envs} envs in {len(groups)} groups on {len(by_worker)} workers</p>"
        f"<p>Dashboard: {links}</p>"
        "<table><thead><tr><th style='text-align:left'>worker</th><th>envs</th><th>groups</th>"
        "<th style='text-align:left'>env indices</th><th>transport</th>"
        "<th style='text-align:left'>channels</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div>"
    )


def _channel(group: dict[str, Any]) -> str:
    """Where a group's channel goes, and whether it is encrypted: an operator checking a firewall needs both."""
    where = group.get("channel") or group.get("address") or group.get("socket_path") or "actor calls"
    return f"{where} ({'encrypted' if group.get('encrypted') else 'not encrypted'})"


def _anchor(url: str) -> str:
    return f'<a href="{escape(url)}" target="_blank">{escape(url)}</a>'


def _ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    parts: list[str] = []
    for i in sorted(indices):
        if parts and not parts[-1].endswith(",") and int(parts[-1].split("-")[-1]) == i - 1:
            head = parts[-1].split("-")[0]
            parts[-1] = f"{head}-{i}"
        else:
            parts.append(str(i))
    return ", ".join(parts)
