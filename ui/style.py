"""The page's CSS, built from the same kind colours the plots use."""
from __future__ import annotations

from ui.render import KIND_COLORS


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def page_css() -> str:
    kinds = "\n".join(
        f".tok-{k} {{ background: {_rgba(c, 0.22)}; border-bottom: 2px solid {c}; }}"
        for k, c in KIND_COLORS.items()
    )
    return f"""
#output-tokens {{
  white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, Menlo, Consolas, monospace;
  font-size: 0.95rem; line-height: 1.7; height: 24rem; overflow-y: auto;
  padding: 0.6rem; border: 1px solid var(--border-color-primary); border-radius: 6px;
  contain: strict;  /* fixed size: a streamed update re-lays out this box only, never the page below */
}}
.tok {{ border-radius: 2px; padding: 0 1px; }}
{kinds}
.tok-rejected {{ text-decoration: line-through; opacity: 0.75; }}
#output-tokens.hide-rejected .tok-rejected {{ display: none; }}
.ds-legend {{ display: flex; gap: 0.5rem; flex-wrap: wrap; font-size: 0.85rem; }}
.ds-legend .tok {{ padding: 0 6px; cursor: help; }}
.ds-stats {{ display: flex; gap: 1.1rem; flex-wrap: wrap; font-size: 0.9rem; }}
.ds-stats b {{ font-weight: 600; opacity: 0.7; }}
.ds-running {{ color: {KIND_COLORS["resampled"]}; font-weight: 600; }}
.ds-env {{ font-size: 0.85rem; border-collapse: collapse; }}
.ds-env th {{ text-align: left; padding-right: 1rem; opacity: 0.7; font-weight: 500; }}
.ds-message {{ font-size: 0.9rem; opacity: 0.8; }}
"""
