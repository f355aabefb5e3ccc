"""The page's own CSS and JavaScript: layout touches, the live character counter and the stream player.

The stream player: a streamed synthesis updates a hidden textbox with `run:rate|<b64 pcm>|<b64 pcm>|…`
(each update appends; Gradio sends appends as diffs). On every change `cosyStream.feed` decodes the
chunks it has not played yet (16-bit little-endian mono PCM) and schedules them back to back on a Web
Audio context, so sound starts with the first chunk. `|END` closes a run, `|CANCEL` stops it.
`cosyStream.stats[run]` records chunks, samples and timings (the browser test reads it).

The session watch (`cosySession`): a page keeps working with whatever sign-in its browser now has, so
when that has ended or become another identity's, a bar at the top says so (sign in again, or reload).
"""

from __future__ import annotations

import json

CSS = """
#cosy-header h1 { margin: 0; font-size: 1.7rem; }
#cosy-header p { margin: .2rem 0 0; opacity: .75; }
#cosy-banner .demo { background: #fff4e5; border: 1px solid #f5a524; color: #7a4100; padding: .7rem 1rem;
  border-radius: 10px; font-weight: 600; }
#cosy-status { font-size: .9rem; opacity: .85; }
#cosy-user { text-align: right; font-size: .9rem; }
.cosy-counter { font-variant-numeric: tabular-nums; font-size: .85rem; text-align: right; opacity: .8; }
.cosy-counter.over { color: #b42318; font-weight: 700; opacity: 1; }
.cosy-counter.job { color: #3538cd; font-weight: 600; opacity: 1; }
.cosy-note { font-size: .88rem; color: #3538cd; }
.cosy-about p { margin: 0 0 .2rem; opacity: .8; font-size: .92rem; }
.cosy-actions button { min-width: 6rem; }
.cosy-progress { margin: .2rem 0 .4rem; }
.cosy-bar { height: .7rem; background: #e0e7ff; border-radius: 6px; overflow: hidden; }
.cosy-bar > div { height: 100%; background: #4f46e5; transition: width .4s; }
.cosy-progress-line { font-size: .85rem; font-variant-numeric: tabular-nums; margin-top: .2rem; }
.cosy-preview { font-size: .9rem; line-height: 1.5; overflow-wrap: anywhere; }
.cosy-preview mark.cosy-pron { background: #fde68a; color: #713f12; border-radius: 3px; padding: 0 1px; }
.cosy-preview mark.cosy-tag { background: #dbeafe; color: #1e3a8a; border-radius: 3px; padding: 0 1px; }
.cosy-preview .cosy-when { opacity: .75; font-size: .8rem; margin-left: .4rem; }
.cosy-preview .cosy-warnings { color: #8a5a00; }
.cosy-preview .bad { color: #b42318; }
.cosy-preview code { white-space: normal; word-break: break-all; }
.cosy-links { display: flex; flex-wrap: wrap; gap: .3rem .9rem; }
.cosy-take { cursor: help; border-bottom: 1px dotted currentColor; }
.cosy-take[data-state="failed"] { color: #b45309; }
.cosy-table table { font-size: .82rem; }
#history-table table { table-layout: fixed; width: 100%; }
#history-table td, #history-table th { overflow-wrap: anywhere; }
/* an admin's "Everyone's entries" on one line: the filter row cut it to "Everyone'" over "entries" */
#history-everyone { min-width: 12rem !important; } #history-everyone label { white-space: nowrap; }
@media (max-width: 640px) { #cosy-header h1 { font-size: 1.3rem; } #cosy-header p { font-size: .85rem; } }
.cosy-feedback .bad { color: #b42318; } .cosy-feedback .warn { color: #8a5a00; }
.cosy-dice { max-width: 3.2rem; min-width: 3.2rem !important; align-self: end; }
/* error toasts at the bottom: at the top (Gradio's place) they sit over the voice lists, which head
   each tab, once the page is scrolled, and over the whole width of a phone */
.toast-wrap { top: auto !important; bottom: var(--size-3) !important; }
.cosy-parts { font-size: .85rem; opacity: .9; } .cosy-parts ul { margin: .1rem 0 0; }
.cosy-parts code { white-space: normal; overflow-wrap: anywhere; }
.cosy-logs textarea { font-family: ui-monospace, Menlo, monospace; font-size: .8rem; }
#cosy-session-notice { position: sticky; top: 0; z-index: 1000; background: #fef3f2; color: #7a271a;
  border-bottom: 2px solid #f04438; padding: .7rem 1rem; font-weight: 600; text-align: center; }
#cosy-session-notice a { margin-left: .5rem; color: #b42318; text-decoration: underline; }
/* a visible keyboard focus everywhere: Gradio's theme removes the outline of text fields, checkboxes,
   radios and sliders and leaves a border change of about 1.3:1 */
.gradio-container :is(input, textarea, select, button, a, [tabindex]):focus-visible {
  outline: 3px solid #3730a3 !important; outline-offset: 2px !important; }
.cosy-sr-only { position: absolute !important; width: 1px; height: 1px; padding: 0; margin: -1px;
  overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; border: 0; }
.cosy-dice { max-width: none; min-width: 6.5rem !important; }
.cosy-scroll { overflow-x: auto; max-width: 100%; }
.cosy-logs-pre { max-height: 32rem; overflow: auto; white-space: pre-wrap; overflow-wrap: anywhere;
  font-family: ui-monospace, Menlo, monospace; font-size: .8rem; margin: 0; }
@media (max-width: 640px) {
  /* the admin's tables wrap whole words in the page's width: scrolled sideways they hid columns that no
     keyboard could scroll to, and squeezed they broke words a letter a line */
  .cosy-table th, .cosy-table td { word-break: normal; overflow-wrap: normal; white-space: nowrap; }
}
"""

_PLAYER = """
window.cosyStream = (() => {
  const st = { ctx: null, run: null, consumed: 0, next: 0, sources: [], stats: {} };
  function unlock() {
    if (!st.ctx) {
      const Ctx = window.AudioContext || window.webkitAudioContext;
      if (!Ctx) return null;
      st.ctx = new Ctx();
    }
    if (st.ctx.state === 'suspended') st.ctx.resume();
    return st.ctx;
  }
  function stop() {
    for (const source of st.sources) { try { source.stop(); } catch (e) { /* already ended */ } }
    st.sources = [];
    st.next = 0;
  }
  function decode(b64) {
    const bin = atob(b64);
    const count = bin.length >> 1;
    const out = new Float32Array(count);
    for (let i = 0; i < count; i++) {
      let v = bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8);
      if (v >= 32768) v -= 65536;
      out[i] = v / 32768;
    }
    return out;
  }
  function feed(value) {
    if (!value) return;
    const parts = value.split('|');
    const head = parts[0].split(':');
    const run = head[0];
    if (run !== st.run) {
      stop();
      st.run = run;
      st.consumed = 1;
      st.stats[run] = { chunks: 0, samples: 0, rate: Number(head[1]) || 24000, startedAt: performance.now(),
                        firstChunkAt: null, endedAt: null, cancelled: false, contextState: null };
    }
    const stats = st.stats[run];
    const ctx = unlock();
    for (let i = st.consumed; i < parts.length; i++) {
      const part = parts[i];
      if (part === 'END') { stats.endedAt = performance.now(); continue; }
      if (part === 'CANCEL') { stats.cancelled = true; stop(); continue; }
      if (!part) continue;
      const samples = decode(part);
      stats.chunks += 1;
      stats.samples += samples.length;
      if (stats.firstChunkAt === null) stats.firstChunkAt = performance.now();
      if (!ctx || samples.length === 0) continue;
      const buffer = ctx.createBuffer(1, samples.length, stats.rate);
      buffer.copyToChannel(samples, 0);
      const source = ctx.createBufferSource();
      source.buffer = buffer;
      source.connect(ctx.destination);
      const at = Math.max(st.next, ctx.currentTime + 0.05);
      source.start(at);
      st.next = at + buffer.duration;
      st.sources.push(source);
      stats.contextState = ctx.state;
    }
    st.consumed = parts.length;
  }
  return { unlock, stop, feed, state: st, stats: st.stats };
})();
"""


SESSION_WATCH = """
window.cosySession = (() => {
  // Whom the page was made for is in #cosy-user's data-who; the browser's cookie may since have ended
  // (logout, expiry, a revoked key) or belong to someone else (a login in another tab). Asked of /v1/me
  // every 15 s, when the tab comes back into view, and at once when any call of the page gets a 401.
  const st = { busy: false, notice: null, seen: null, label: null };
  const plainFetch = window.fetch.bind(window);
  const shown = () => document.querySelector('#cosy-user [data-who]');
  function say(message, linkText, action) {
    if (!st.notice) {
      st.notice = document.createElement('div');
      st.notice.id = 'cosy-session-notice';
      st.notice.setAttribute('role', 'alert');
      document.body.prepend(st.notice);
    }
    const link = document.createElement('a');
    link.textContent = linkText;
    link.href = action.href || '#';
    if (action.reload) link.addEventListener('click', (e) => { e.preventDefault(); location.reload(); });
    st.notice.replaceChildren(document.createTextNode(message + ' '), link);
  }
  function clear(el) {
    if (st.notice) { st.notice.remove(); st.notice = null; }
    if (st.label !== null) el.textContent = st.label;
    st.seen = null;
    st.label = null;
  }
  async function check() {
    const el = shown();
    if (!el || st.busy) return;
    st.busy = true;
    try {
      const answer = await plainFetch('/v1/me', {
        credentials: 'same-origin', cache: 'no-store', headers: { 'X-Cosyserve-Passive': '1' },
      });
      const d = el.dataset;
      if (st.label === null) st.label = el.textContent;
      if (answer.status === 401) {
        st.seen = 'ended';
        el.textContent = d.signedOut;
        const back = d.login + '?next=' + encodeURIComponent(location.pathname + location.search);
        say(d.ended, d.signIn, { href: back });
      } else if (answer.ok) {
        const me = await answer.json();
        if (me.owner === d.who) { if (st.seen) clear(el); return; }
        const name = me.name || me.kind || '?';
        st.seen = me.owner;
        el.textContent = d.signedIn.replaceAll('{name}', name);
        say(d.switched.replaceAll('{name}', name), d.reload, { reload: true });
      }
    } catch (e) { /* offline or the server restarting: the next check tells */ }
    finally { st.busy = false; }
  }
  window.fetch = async (...args) => {
    const answer = await plainFetch(...args);
    if (answer.status === 401) setTimeout(check, 0);
    return answer;
  };
  setInterval(check, 15000);
  window.addEventListener('focus', check);
  document.addEventListener('visibilitychange', () => { if (!document.hidden) check(); });
  return { check, state: st };
})();
"""


# Status lines that change after an action (a result, a check, a saved voice, a refused change, a batch's
# progress): their text is said by one polite live region, the last change of each line after it has been
# still for a moment (a streaming result's "so far" line would otherwise be read many times a second).
ANNOUNCED = ("[id$='-feedback']", "[id$='-info']", "[id$='-voice-note']", "[id$='-instruct-note']",
             "[id$='-progress']", "#voices-status", "#history-status", "#admin-message",
             "#admin-keys-message", "#batch-progress", "#batch-links")  # fmt: skip

ANNOUNCER = """
window.cosyAnnounce = (() => {
  const SELECTOR = __SELECTOR__;
  let region = null; const timers = new Map(); const said = new WeakMap();
  function say(text) {
    if (!region) {
      region = document.createElement('div');
      region.id = 'cosy-live'; region.className = 'cosy-sr-only';
      region.setAttribute('role', 'status'); region.setAttribute('aria-live', 'polite');
      document.body.appendChild(region);
    }
    region.textContent = '';
    setTimeout(() => { region.textContent = text; }, 50);
  }
  function changed(block) {
    clearTimeout(timers.get(block));
    timers.set(block, setTimeout(() => {
      const text = (block.querySelector('.prose, .html-container') || block).innerText.trim();
      const shown = block.offsetParent !== null;
      if (text && text !== said.get(block) && shown) { said.set(block, text); say(text); }
      if (!text) said.delete(block);
    }, 700));
  }
  new MutationObserver((records) => {
    for (const r of records) {
      const el = r.target.nodeType === 1 ? r.target : r.target.parentElement;
      const block = el && el.closest(SELECTOR);
      if (block) changed(block);
    }
  }).observe(document.documentElement, { subtree: true, childList: true, characterData: true });
  return say;
})();
""".replace("__SELECTOR__", json.dumps(", ".join(ANNOUNCED)))


def page_lang_js(title_zh: str, title_en: str) -> str:
    """A JS function for the page's language state: the document's `lang` and title follow it."""
    return (
        "(lang) => { document.documentElement.lang = lang === 'zh' ? 'zh-CN' : 'en'; "
        f"document.title = lang === 'zh' ? {json.dumps(title_zh)} : {json.dumps(title_en)}; return []; }}"
    )


def focus_js(elem_id: str) -> str:
    """A JS function that puts the focus on `elem_id`'s button (after the one that had it was hidden)."""
    return (
        "(...args) => { setTimeout(() => { "
        f"const root = document.getElementById({json.dumps(elem_id)}); "
        "const target = root && (root.matches('button') ? root "
        ": root.querySelector('button, input, textarea')); "
        "if (target) target.focus({ preventScroll: true }); }, 150); return args; }"
    )


def head_html() -> str:
    """The `<script>`s put into the page's head: the stream player, the session watch, the announcer."""
    return f"<script>{_PLAYER}</script><script>{SESSION_WATCH}</script><script>{ANNOUNCER}</script>"


def counter_js(limit: int, job_limit: int | None = None) -> str:
    """A JS function: (text, page language) → the counter's HTML (`n / limit`; over: made as a job; red over
    the job limit)."""
    return (
        "(text, lang) => { const n = Array.from((text || '').normalize('NFC').trim()).length; "
        f"const limit = {json.dumps(limit)}; const jobLimit = {json.dumps(job_limit or limit)}; "
        "const cls = n > jobLimit ? 'cosy-counter over' : (n > limit ? 'cosy-counter job' : 'cosy-counter'); "
        "const job = lang === 'zh' ? ' · 后台任务' : ' · job'; "
        "const note = n > jobLimit ? '⚠ ' : ''; const tail = n > limit && n <= jobLimit ? job : ''; "
        'return `<div class="${cls}">${note}${n} / ${limit}${tail}</div>`; }'
    )


DICE_JS = "() => String(Math.floor(Math.random() * 2147483647))"
FEED_JS = "(value) => { if (window.cosyStream) window.cosyStream.feed(value); }"
UNLOCK_JS = "() => { if (window.cosyStream) window.cosyStream.unlock(); }"


def click_js(mode: str, inputs: int) -> str:
    """A JS function for a Generate click of `mode` whose last of `inputs` inputs is its token: a new
    random one, remembered for the Cancel button (which may be pressed while the click still waits in the
    page's queue, before its handler has registered it). The function also gets the outputs' values after
    the inputs; only the inputs go on to the server."""
    return (
        "(...args) => { const token = crypto.getRandomValues(new Uint32Array(4)).join('-'); "
        f"(window.cosyClicks = window.cosyClicks || {{}})[{json.dumps(mode)}] = token; "
        f"const inputs = args.slice(0, {inputs}); inputs[{inputs - 1}] = token; return inputs; }}"
    )


def cancel_js(mode: str) -> str:
    """A JS function for `mode`'s Cancel: stops the stream player and sends the last click's token."""
    return (
        "() => { if (window.cosyStream) window.cosyStream.stop(); "
        f"return [(window.cosyClicks || {{}})[{json.dumps(mode)}] || '']; }}"
    )


def refocus_js(elem_id: str) -> str:
    """A JS function for an audio input's upload/recording event: the upload button that had the focus is
    replaced by the player, which leaves the focus on the page's body (the next Tab starts again at the
    top); put it on the new player's play button instead, without scrolling, unless the user moved on."""
    return (
        "(...args) => { const lost = () => "
        "!document.activeElement || document.activeElement === document.body; "
        "const put = (tries) => { if (!lost()) return; "
        f"const root = document.getElementById({json.dumps(elem_id)}); "
        "const target = root && (root.querySelector('button.play-pause-button, button[aria-label=\"Play\"]') "
        "|| root.querySelector('button:not([disabled])')); "
        "if (target && target.offsetParent !== null) target.focus({ preventScroll: true }); "
        "else if (tries > 0) setTimeout(() => put(tries - 1), 100); }; "
        "setTimeout(() => put(30), 0); return args; }"
    )


def counter_html(count: int, limit: int) -> str:
    """The counter as the server renders it (initial value); the browser keeps it live."""
    cls = "cosy-counter over" if count > limit else "cosy-counter"
    return f'<div class="{cls}">{"⚠ " if count > limit else ""}{count} / {limit}</div>'
