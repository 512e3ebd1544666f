"""The page's CSS, built from the same kind colours the plots use."""
from __future__ import annotations

from ui.render import KIND_COLORS


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


# Plotly draws its text and grid with inline colours for a light page. The figures' backgrounds are transparent
# (ui/plots.py), so in dark mode only the ink needs changing; !important outranks the inline style.
DARK_PLOTS = """
.dark .js-plotly-plot .main-svg text { fill: #e3e3e3 !important; }
.dark .js-plotly-plot .gridlayer path,
.dark .js-plotly-plot .zerolinelayer path { stroke: rgba(255,255,255,0.14) !important; }
.dark .js-plotly-plot .legend .bg { fill: transparent !important; }
"""

# "running" in the live stats line: the resampled orange (#ff7f0e) reads at 2.5:1 on a light page, under the 4.5:1
# text needs (WCAG AA); this darker orange reads at 5:1 there. A dark page keeps the orange itself (5.9:1).
RUNNING_INK = "#b45309"


def page_css() -> str:
    kinds = "\n".join(
        f".tok-{k} {{ background: {_rgba(c, 0.22)}; border-bottom: 2px solid {c}; }}"
        for k, c in KIND_COLORS.items()
    )
    return f"""
#output-tokens {{
  white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, Menlo, Consolas, monospace;
  font-size: 0.95rem; line-height: 1.7; height: 24rem;
  overflow-y: auto !important;  /* gradio's block sets overflow: visible inline */
  padding: 0.6rem; border: 1px solid var(--border-color-primary); border-radius: 6px;
  contain: strict;  /* fixed size: a streamed update re-lays out this box only, never the page below */
}}
.tok {{ border-radius: 2px; padding: 0 1px; }}
{kinds}
.tok-rejected {{ text-decoration: line-through; opacity: 0.75; }}
#output-tokens.hide-rejected .tok-rejected {{ display: none; }}
/* the live stats line while a run streams: the page's font, kept in view at the foot of the box */
#output-tokens .ds-live-stats:not(:empty) {{
  position: sticky; bottom: -0.6rem; margin-top: 0.6rem; padding: 0.3rem 0; white-space: normal;
  font-family: var(--font); line-height: 1.4; background: var(--block-background-fill);
  border-top: 1px solid var(--border-color-primary);
}}
.tok-special::before {{
  content: attr(data-mark); font-size: 0.7em; padding: 0 4px; margin: 0 2px; border-radius: 8px;
  border: 1px solid currentColor; opacity: 0.65; user-select: none; vertical-align: 0.1em;
}}
.ds-legend {{ display: flex; gap: 0.5rem; flex-wrap: wrap; font-size: 0.85rem; align-items: baseline; }}
.ds-legend .tok {{ padding: 0 6px; cursor: help; }}
.ds-legend-special {{ cursor: help; opacity: 0.85; }}
.ds-stats {{ display: flex; gap: 1.1rem; flex-wrap: wrap; font-size: 0.9rem; }}
.ds-stats b {{ font-weight: 600; opacity: 0.7; }}
.ds-stat[title] {{ cursor: help; text-decoration: underline dotted; text-underline-offset: 3px; }}
.ds-note {{ font-size: 0.8rem; opacity: 0.75; margin-top: 0.25rem; }}
.ds-running {{ color: {RUNNING_INK}; font-weight: 600; }}
.dark .ds-running {{ color: {KIND_COLORS["resampled"]}; }}
.ds-env {{ font-size: 0.85rem; border-collapse: collapse; }}
.ds-env th {{ text-align: left; padding-right: 1rem; opacity: 0.7; font-weight: 500; }}
.ds-message {{ font-size: 0.9rem; opacity: 0.8; }}
.ds-error {{
  font-family: var(--font); white-space: normal; padding: 0.6rem 0.8rem; border-radius: 6px;
  border: 1px solid {KIND_COLORS["rejected"]}; background: {_rgba(KIND_COLORS["rejected"], 0.08)};
}}
/* tables: headers break between words, never inside one (gradio's header spans break anywhere) */
#profile-table .header, #compare-table .header, #runs .header {{
  word-break: normal !important; overflow-wrap: normal !important; hyphens: none;
}}
{DARK_PLOTS}
"""
