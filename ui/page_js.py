"""The page's own JavaScript: the streamed output box (a gr.HTML js_on_load) and the show-rejected toggle.

Why the output box has its own renderer: gr.HTML re-renders its template on every update, parsing the whole
value into a scratch element and walking it against the live one, so a run of n tokens costs O(n^2) DOM work
on the browser, which on a small CPU shares the cores with the engine. Here the template is constant and a
watch on `value` appends only the new suffix (the value is append-only while a run streams, see render.py),
at most once per animation frame however many updates arrived; a value that is not an extension (a new run,
an error) replaces the content. Tooltips are built on hover from each span's data-t, in the format of
render.token_tooltip, so each span carries a few numbers instead of a paragraph.
"""

OUTPUT_TEMPLATE = '<div class="ds-stream"></div>'

OUTPUT_JS = r"""
const box = element.querySelector('.ds-stream');
let shown = '';
let queued = false;

function flush() {
  queued = false;
  const value = props.value || '';
  const scroller = element.closest('#output-tokens') || element;
  const atEnd = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 48;
  if (value.length >= shown.length && value.startsWith(shown)) {
    if (value.length > shown.length) box.insertAdjacentHTML('beforeend', value.slice(shown.length));
  } else {
    box.innerHTML = value;
  }
  shown = value;
  if (atEnd) scroller.scrollTop = scroller.scrollHeight;  // follow the stream unless the reader scrolled up
}

function schedule() {
  if (queued) return;
  queued = true;
  requestAnimationFrame(flush);
}

function tooltip(span) {
  const kind = [...span.classList].find(c => c.startsWith('tok-') && c !== 'tok-special').slice(4);
  const [id, pos, lat, pTarget, pDraft] = span.dataset.t.split(' ');
  const lines = [`${kind} · token id ${id} · round ${span.dataset.r}`];
  if (span.dataset.mark) lines[0] += ` · special token ${span.dataset.mark}`;
  if (pos !== '-') lines.push(`draft position ${pos}`);
  lines.push(lat !== '-' ? `latency ${lat} ms` : 'not emitted');
  if (pTarget !== '-') lines.push(`p_target ${pTarget}`);
  if (pDraft !== '-') lines.push(`p_draft ${pDraft}`);
  return lines.join('\n');
}

element.addEventListener('mouseover', (event) => {
  const span = event.target.closest && event.target.closest('span.tok[data-t]');
  if (span && !span.title) span.title = tooltip(span);
});
watch('value', schedule);
schedule();
"""

SHOW_REJECTED_JS = "(show) => { document.getElementById('output-tokens').classList.toggle('hide-rejected', !show); }"
