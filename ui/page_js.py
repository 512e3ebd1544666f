"""The page's own JavaScript: the streamed output box (a gr.HTML js_on_load), the show-rejected toggle, and the
sliders' number boxes left as typed (KEEP_TYPED_JS).

The output box renders itself. While a run streams, its value is a marker naming the run and the box fetches the new
spans and the stats line from the server (ui/stream.py: `poll` at stream.ROUTE, every stream interval), appending
each answer as it comes; the run's last update carries the whole HTML, of which the box already shows a prefix, so
only the rest (if any) is appended. A value that is not an extension (an error, a value set from elsewhere) replaces
the content. gr.HTML's own rendering would parse the whole value into a scratch element on every update and walk it
against the live one: O(n^2) DOM work over a run, on a CPU the engine shares. Tooltips are built on hover from each
span's data-t (and data-mark, data-inferred), in the format of render.token_tooltip, so a span carries a few numbers
instead of a paragraph.
"""
from ui import stream

# the live stats line sits under the tokens while a run streams; the stats component takes over at its end
OUTPUT_TEMPLATE = '<div class="ds-stream"></div><div class="ds-live-stats"></div>'

OUTPUT_JS = r"""
const box = element.querySelector('.ds-stream');
const liveStats = element.querySelector('.ds-live-stats');
const POLL_MS = __POLL_MS__;
let shown = '';       // the HTML now in the box
let live = null;      // {token, offset} of the run the page is fetching spans for (ui/stream.py)
let queued = false;

function put(html, replace) {
  const scroller = element.closest('#output-tokens') || element;
  const atEnd = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 48;
  if (replace) box.innerHTML = html; else box.insertAdjacentHTML('beforeend', html);
  shown = replace ? html : shown + html;
  if (atEnd) scroller.scrollTop = scroller.scrollHeight;  // follow the stream unless the reader scrolled up
}

function flush() {
  queued = false;
  const value = props.value || '';
  const m = value.match(/^<!--ds-live:([0-9a-f]+)-->$/);
  if (m) {  // a run started: fetch its spans
    if (!live || live.token !== m[1]) { live = {token: m[1], offset: 0}; put('', true); poll(live); }
    return;
  }
  live = null;  // the run's last update: the whole HTML, of which the box shows a prefix
  liveStats.innerHTML = '';  // and the stats component has the final line
  if (value.length >= shown.length && value.startsWith(shown)) {
    if (value.length > shown.length) put(value.slice(shown.length), false);
  } else {
    put(value, true);
  }
}

async function poll(run) {
  while (live === run) {
    let got = null;
    try {
      const r = await fetch(`__ROUTE__?token=${run.token}&offset=${run.offset}`);
      got = r.ok ? await r.json() : null;
    } catch (e) { got = null; }
    if (live !== run) return;  // the last update came first: it holds these spans too
    if (got && got.html) { put(got.html, false); run.offset = got.offset; }
    if (got && got.stats) liveStats.innerHTML = got.stats;
    if (got && got.done) return;
    await new Promise(r => setTimeout(r, POLL_MS));
  }
}

function schedule() {
  if (queued) return;
  queued = true;
  requestAnimationFrame(flush);
}

function tooltip(span) {
  const kind = [...span.classList].find(c => c.startsWith('tok-') && c !== 'tok-special').slice(4);
  const [id, pos, lat, pTarget, pDraft] = span.dataset.t.split(' ');
  const shown = span.dataset.inferred ? `${kind} (inferred from the chunk's token count)` : kind;
  const lines = [`${id !== '-' ? `${shown} · token id ${id}` : shown} · round ${span.dataset.r}`];
  if (span.dataset.mark) lines[0] += ` · special token ${span.dataset.mark}`;
  if (pos !== '-') lines.push(`draft position ${pos}`);
  lines.push(lat !== '-' ? `latency ${lat} ms` : 'not emitted');
  if (pTarget !== '-') lines.push(`p_target ${pTarget} (the target model's probability of this token)`);
  if (pDraft !== '-') lines.push(`p_draft ${pDraft} (the drafter's probability of the token it proposed)`);
  return lines.join('\n');
}

element.addEventListener('mouseover', (event) => {
  const span = event.target.closest && event.target.closest('span.tok[data-t]');
  if (span && !span.title) span.title = tooltip(span);
});
watch('value', schedule);
schedule();
"""


def output_js(poll_s: float) -> str:
    """OUTPUT_JS with the page's poll interval (Runtime.stream_interval_s) and the poll route, relative to the page
    (so an app served under a root path fetches its own)."""
    return (OUTPUT_JS.replace("__POLL_MS__", str(max(16, round(poll_s * 1000))))
            .replace("__ROUTE__", stream.ROUTE.removeprefix("/")))


SHOW_REJECTED_JS = "(show) => { document.getElementById('output-tokens').classList.toggle('hide-rejected', !show); }"


# A slider's number box pulls a typed value back into the slider's range when it loses focus, and the run went
# with the pulled-back value without a word (k=100 ran k<=16 while the box said 100; 0 new tokens made one). Left
# as typed, the value reaches the app, which refuses it naming the range the request accepts (engine/request.py),
# as it does for an API client. A capture listener runs before the box's own and stops only an out-of-range blur.
KEEP_TYPED_JS = r"""
() => {
  document.addEventListener('blur', (e) => {
    const t = e.target;
    if (!(t instanceof HTMLInputElement) || t.type !== 'number') return;
    if (!(t.getAttribute('aria-label') || '').startsWith('number input for ')) return;  // a slider's box
    const v = Number(t.value);
    if (t.value !== '' && (v < Number(t.min) || v > Number(t.max))) e.stopImmediatePropagation();
  }, true);
}
"""
