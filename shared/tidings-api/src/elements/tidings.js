/* Tidings elements: <tidings-inbox> and <tidings-preferences> (docs/site.md).
 * Plain JavaScript, no framework, shadow DOM. Served by Tidings at GET /elements/tidings.js. */
(() => {
  "use strict";
  if (customElements.get("tidings-inbox")) return;

  /** UI strings; `{n}` is a number. */
  const STRINGS = {
    en: {
      title: "Notifications", bell: "Notifications, {n} unread", unread: "{n} unread", none_unread: "No unread notifications",
      read_all: "Mark all as read", archive: "Archive", archive_label: "Archive: {t}", mark_read: "Mark as read: {t}",
      more: "Load more", empty: "No notifications yet", error: "Notifications are unavailable right now.",
      offline: "Reconnecting…", loading: "Loading…", new_one: "New notification: {t}",
      prefs: "Notification preferences", required: "Required", saved: "Saved", save_failed: "Not saved: try again",
      prefs_error: "Preferences are unavailable right now.", topic: "Notification", all: "All messages",
      transactional: "Orders and account", marketing: "News and offers",
      email: "Email", sms: "SMS", push: "Push", inapp: "In-app", webhook: "Webhook",
    },
    "zh-CN": {
      title: "通知", bell: "通知，{n} 条未读", unread: "{n} 条未读", none_unread: "没有未读通知",
      read_all: "全部标为已读", archive: "归档", archive_label: "归档：{t}", mark_read: "标为已读：{t}",
      more: "加载更多", empty: "暂无通知", error: "暂时无法获取通知。",
      offline: "正在重新连接…", loading: "加载中…", new_one: "新通知：{t}",
      prefs: "通知偏好设置", required: "必需", saved: "已保存", save_failed: "未保存，请重试",
      prefs_error: "暂时无法获取偏好设置。", topic: "通知类型", all: "所有消息",
      transactional: "订单与账户", marketing: "资讯与优惠",
      email: "邮件", sms: "短信", push: "推送", inapp: "站内信", webhook: "Webhook",
    },
  };

  const pickLocale = (l) => (/^zh\b/i.test(l || "") ? "zh-CN" : "en");

  /** The claims of a Tidings token (`payload.kid.tag`, payload base64url JSON): for scheduling
   * the refresh and telling a refresh from another user; never trusted for anything else. */
  function claims(token) {
    try {
      const b64 = token.split(".")[0].replace(/-/g, "+").replace(/_/g, "/");
      return JSON.parse(atob(b64 + "===".slice((b64.length + 3) % 4)));
    } catch (_) {
      return null;
    }
  }

  const BASE_CSS = `
:host { font: var(--tidings-font, inherit); color: var(--tidings-fg, #111827); }
*, *::before, *::after { box-sizing: border-box; }
button { font: inherit; color: inherit; cursor: pointer; border: 0; background: none; }
button:focus-visible { outline: 2px solid var(--tidings-focus, var(--tidings-accent, #2563eb)); outline-offset: 2px; }
button[disabled] { cursor: not-allowed; opacity: .55; }
.sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; }
.error { color: var(--tidings-error, #b91c1c); padding: 12px 16px; margin: 0; }
.muted { color: var(--tidings-muted, #6b7280); }
`;

  /** What both elements share: the `api` and `token` attributes and calls with the token. */
  class Base extends HTMLElement {
    constructor() {
      super();
      this.attachShadow({ mode: "open" });
      /** The last failure (a message), for a page or a test to read. */
      this.lastError = null;
      /** Optional `async () => token | {token, expires_at}` called before the token expires. */
      this.refreshToken = null;
      this._refreshTimer = 0;
    }
    get api() { return (this.getAttribute("api") || "").replace(/\/+$/, ""); }
    get token() { return this.getAttribute("token") || ""; }
    set token(v) { this.setAttribute("token", v); }
    get locale() { return pickLocale(this.getAttribute("locale") || document.documentElement.lang); }
    t(key, vars) {
      const s = (this.strings && this.strings[key]) || STRINGS[this.locale][key] || STRINGS.en[key] || key;
      return s.replace(/\{(\w)\}/g, (_, k) => (vars && vars[k] != null ? vars[k] : ""));
    }
    /** The token's expiry in ms since the epoch: the `expires-at` attribute, else the token's own. */
    expiresAt() {
      const attr = Date.parse(this.getAttribute("expires-at") || "");
      if (!Number.isNaN(attr)) return attr;
      const c = claims(this.token);
      return c && typeof c.exp === "number" ? c.exp * 1000 : null;
    }
    expired() {
      const at = this.expiresAt();
      return at != null && Date.now() >= at;
    }
    /** Fires `token-expiring` (and calls `refreshToken`) a minute before expiry (or at 80% of a
     * shorter life), and at once when already expired. */
    scheduleRefresh() {
      clearTimeout(this._refreshTimer);
      const at = this.expiresAt();
      if (at == null || !this.isConnected) return;
      const left = at - Date.now();
      const lead = Math.min(60000, left * 0.2);
      this._refreshTimer = setTimeout(() => this.tokenExpiring(), Math.max(0, left - lead));
    }
    async tokenExpiring() {
      // Once per token: a new token that is refused too must not start a loop of refreshes.
      if (this._askedFor === this.token) return;
      this._askedFor = this.token;
      const expires_at = this.expiresAt();
      this.dispatchEvent(new CustomEvent("token-expiring", { bubbles: true, composed: true,
        detail: { expires_at: expires_at && new Date(expires_at).toISOString() } }));
      if (typeof this.refreshToken !== "function") return;
      try {
        const got = await this.refreshToken();
        const token = typeof got === "string" ? got : got && got.token;
        if (got && got.expires_at) this.setAttribute("expires-at", got.expires_at);
        if (token) this.setAttribute("token", token);
      } catch (e) {
        this.fail(e);
      }
    }
    /** A call with the user token; the answer's JSON, or throws (with `.status`). */
    async call(method, path, body) {
      const init = { method, headers: { Authorization: "Bearer " + this.token }, mode: "cors", credentials: "omit" };
      if (body !== undefined) {
        init.headers["Content-Type"] = "application/json";
        init.body = JSON.stringify(body);
      }
      const res = await fetch(this.api + path, init);
      if (res.status === 401) this.tokenExpiring();
      if (!res.ok) {
        let detail = "";
        try { detail = (await res.json()).detail || ""; } catch (_) { /* not JSON */ }
        const err = new Error(`${method} ${path}: ${res.status} ${detail}`.trim());
        err.status = res.status;
        throw err;
      }
      return res.status === 204 ? null : res.json();
    }
    fail(e) {
      this.lastError = String((e && e.message) || e);
      this.dispatchEvent(new CustomEvent("tidings-error", { bubbles: true, composed: true, detail: { message: this.lastError } }));
    }
    disconnectedCallback() { clearTimeout(this._refreshTimer); }
  }

  const INBOX_CSS = BASE_CSS + `
:host { display: inline-block; position: relative; }
.bell { position: relative; display: inline-flex; align-items: center; justify-content: center; width: 40px; height: 40px;
  border-radius: 50%; color: var(--tidings-bell, currentColor); }
.bell:hover { background: var(--tidings-hover, rgba(0,0,0,.06)); }
.bell svg { width: 24px; height: 24px; }
.badge { position: absolute; top: 2px; right: 0; min-width: 18px; height: 18px; padding: 0 5px; border-radius: 9px;
  font-size: 11px; font-weight: 700; line-height: 18px; text-align: center;
  background: var(--tidings-badge-bg, #dc2626); color: var(--tidings-badge-fg, #fff); }
.badge[hidden] { display: none; }
.panel { position: absolute; z-index: 1000; top: 44px; right: var(--tidings-panel-right, 0); width: var(--tidings-width, 360px);
  max-width: 92vw; max-height: var(--tidings-height, 480px); overflow: auto; background: var(--tidings-bg, #fff);
  border: 1px solid var(--tidings-border, #e5e7eb); border-radius: var(--tidings-radius, 10px);
  box-shadow: var(--tidings-shadow, 0 10px 30px rgba(0,0,0,.12)); }
:host([inline]) .panel { position: static; margin-top: 4px; }
.panel[hidden] { display: none; }
header { display: flex; align-items: center; justify-content: space-between; gap: 8px; padding: 12px 16px;
  border-bottom: 1px solid var(--tidings-border, #e5e7eb); }
h2 { font-size: 15px; margin: 0; }
.link { color: var(--tidings-accent, #2563eb); font-size: 13px; padding: 2px 4px; border-radius: 4px; }
ul { list-style: none; margin: 0; padding: 0; }
li { display: flex; align-items: flex-start; border-bottom: 1px solid var(--tidings-border, #e5e7eb); }
li.unread { background: var(--tidings-unread-bg, #eff6ff); }
.open { flex: 1; text-align: left; padding: 10px 8px 10px 16px; display: grid; gap: 2px; border-radius: 0; }
.open strong { font-size: 14px; }
li.unread .open strong::before { content: ""; display: inline-block; width: 8px; height: 8px; margin-right: 6px;
  border-radius: 50%; background: var(--tidings-accent, #2563eb); vertical-align: middle; }
li:not(.unread) .open strong { font-weight: 500; }
.open span { font-size: 13px; }
.open time { font-size: 12px; color: var(--tidings-muted, #6b7280); }
.archive { padding: 10px 12px; color: var(--tidings-muted, #6b7280); font-size: 12px; }
.foot { padding: 10px 16px; text-align: center; }
.status { padding: 12px 16px; margin: 0; }
`;

  const LOCK_SVG = '<svg viewBox="0 0 24 24" width="11" height="11" aria-hidden="true" fill="none" stroke="currentColor" ' +
    'stroke-width="2.5"><rect x="4" y="11" width="16" height="10" rx="2"/><path d="M8 11V7a4 4 0 0 1 8 0v4"/></svg>';
  const BELL_SVG = '<svg viewBox="0 0 24 24" aria-hidden="true" fill="none" stroke="currentColor" stroke-width="2" ' +
    'stroke-linecap="round" stroke-linejoin="round"><path d="M18 8a6 6 0 0 0-12 0c0 7-3 9-3 9h18s-3-2-3-9"/>' +
    '<path d="M13.73 21a2 2 0 0 1-3.46 0"/></svg>';

  /**
   * `<tidings-inbox api token locale>`: the bell, the unread count and the list.
   * Attributes: `api` (the Tidings base URL), `ws` (the live feed's URL when it is not
   * `{api}/v1/ws`: on AWS the stack's `InboxFeedUrl`), `token` (from POST /v1/users/{id}/inbox/token;
   * setting it swaps the token), `expires-at` (optional), `locale` (`en`, `zh-CN`), `open`
   * (the panel shown), `inline` (the panel in the flow rather than a dropdown), `page-size`,
   * `reconnect-base-ms` (1000), `reconnect-max-ms` (30000).
   * Events: `unread-change` {unread_count}, `token-expiring` {expires_at}, `tidings-error` {message},
   * `tidings-message` {message}.
   */
  class TidingsInbox extends Base {
    static get observedAttributes() { return ["token", "api", "ws", "locale", "open", "expires-at"]; }
    constructor() {
      super();
      this.items = [];
      this.unreadCount = 0;
      this.nextCursor = null;
      /** `loading` | `ready` | `error`. */
      this.state = "loading";
      /** Whether the live feed is open. */
      this.live = false;
      /** Connections opened (the first and every reconnect) and reconnects tried. */
      this.connectAttempts = 0;
      this.reconnectAttempts = 0;
      /** Each reconnect scheduled: {at (performance.now()), delay, ceiling} (ms). */
      this.reconnectLog = [];
      /** Whether a reconnect is waiting for the tab to be shown again. */
      this.paused = false;
      this._failures = 0;
      this._timer = 0;
      this._ws = null;
      this._gen = 0;
      this._onVisibility = () => this.visibility();
      this.shadowRoot.innerHTML = `<style>${INBOX_CSS}</style>
<button class="bell" part="bell" aria-haspopup="true" aria-expanded="false" aria-controls="panel">${BELL_SVG}<span class="badge" part="badge" aria-hidden="true" hidden></span></button>
<span class="sr" role="status" aria-live="polite" aria-atomic="true"></span>
<section class="panel" id="panel" part="panel" hidden>
  <header><h2></h2><button class="link read-all" part="read-all"></button></header>
  <p class="status muted" role="status"></p>
  <ul part="list"></ul>
  <div class="foot"><button class="link more" hidden></button></div>
</section>`;
      const $ = (s) => this.shadowRoot.querySelector(s);
      this.$ = { bell: $(".bell"), badge: $(".badge"), live: $(".sr"), panel: $(".panel"), h2: $("h2"),
        readAll: $(".read-all"), status: $(".status"), list: $("ul"), more: $(".more") };
      this.$.bell.addEventListener("click", () => this.toggleAttribute("open"));
      this.$.readAll.addEventListener("click", () => this.markAllRead());
      this.$.more.addEventListener("click", () => this.loadMore());
      this.$.panel.addEventListener("keydown", (e) => {
        if (e.key === "Escape" && !this.hasAttribute("inline")) { this.removeAttribute("open"); this.$.bell.focus(); }
      });
      this.$.list.addEventListener("click", (e) => {
        const button = e.target.closest("button");
        const li = button && button.closest("li");
        if (!li) return;
        if (button.classList.contains("archive")) this.archive(li.dataset.id);
        else this.markRead(li.dataset.id);
      });
    }

    connectedCallback() {
      document.addEventListener("visibilitychange", this._onVisibility);
      this.start();
    }
    disconnectedCallback() {
      super.disconnectedCallback();
      document.removeEventListener("visibilitychange", this._onVisibility);
      this.stop();
    }
    attributeChangedCallback(name, old, value) {
      if (!this.isConnected || old === value) return;
      if (name === "open") return this.renderChrome();
      if (name === "expires-at") return this.scheduleRefresh();
      if (name === "locale") return this.render();
      if (name === "token") {
        const [a, b] = [claims(old || ""), claims(value || "")];
        const sameUser = a && b && a.c && b.c && a.c.t === b.c.t && a.c.u === b.c.u;
        if (sameUser && this.state === "ready") {
          // A refresh: the same inbox, a new socket with the new token.
          this.scheduleRefresh();
          this.closeSocket();
          clearTimeout(this._timer);
          this._timer = 0;
          this._failures = 0;
          this.paused = false;
          this.openSocket();
          return;
        }
      }
      this.start();
    }

    /** Everything from the start: the first page, then the live feed. */
    async start() {
      this.stop();
      const gen = ++this._gen;
      this.items = [];
      this.nextCursor = null;
      this.state = "loading";
      this.render();
      if (!this.api || !this.token) return;
      this.scheduleRefresh();
      try {
        const page = await this.call("GET", "/v1/me/inbox?limit=" + this.pageSize());
        if (gen !== this._gen) return;
        this.items = page.items || [];
        this.nextCursor = page.next_cursor || null;
        this.setCount(page.unread_count);
        this.state = "ready";
        this.render();
        this.openSocket();
      } catch (e) {
        if (gen !== this._gen) return;
        this.state = "error";
        this.fail(e);
        this.render();
      }
    }
    stop() {
      this._gen++;
      clearTimeout(this._timer);
      this._timer = 0;
      this.closeSocket();
    }
    pageSize() { return Math.min(500, Math.max(1, parseInt(this.getAttribute("page-size"), 10) || 20)); }
    num(attr, dflt) {
      const n = parseInt(this.getAttribute(attr), 10);
      return n > 0 ? n : dflt;
    }

    /* The live feed. */
    openSocket() {
      if (!this.isConnected || !this.token || this._ws || this.state !== "ready") return;
      if (document.hidden && this.connectAttempts > 0) { this.paused = true; return; }
      if (this.expired()) { this.tokenExpiring(); return; }
      const newest = this.items.length ? this.items[0].message_id : "";
      const feed = this.getAttribute("ws") || this.api.replace(/^http/i, "ws") + "/v1/ws";
      const url = feed + (feed.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(this.token) +
        (newest ? "&since=" + encodeURIComponent(newest) : "");
      let ws;
      this.connectAttempts++;
      try {
        ws = new WebSocket(url);
      } catch (e) {
        this.fail(e);
        return this.scheduleReconnect();
      }
      this._ws = ws;
      const first = this.connectAttempts === 1;
      ws.onopen = () => {
        if (this._ws !== ws) return;
        this._failures = 0;
        this.live = true;
        this.renderChrome();
        // Back after a drop: what changed meanwhile (reads in other tabs, archives).
        if (!first) this.resync();
      };
      ws.onmessage = (e) => {
        if (this._ws !== ws) return;
        try { this.onEvent(JSON.parse(e.data)); } catch (_) { /* not an event */ }
      };
      ws.onclose = () => {
        if (this._ws !== ws) return;
        this._ws = null;
        this.live = false;
        this.renderChrome();
        this.scheduleReconnect();
      };
    }
    closeSocket() {
      const ws = this._ws;
      this._ws = null;
      this.live = false;
      if (ws) { ws.onclose = ws.onmessage = ws.onopen = null; ws.close(); }
    }
    /** Exponential backoff with full jitter, capped; none while the tab is hidden. */
    scheduleReconnect() {
      if (!this.isConnected || this.state !== "ready" || this._timer) return;
      if (document.hidden) { this.paused = true; return; }
      const ceiling = Math.min(this.num("reconnect-max-ms", 30000), this.num("reconnect-base-ms", 1000) * 2 ** this._failures);
      const delay = Math.random() * ceiling;
      this._failures = Math.min(this._failures + 1, 30);
      this.reconnectLog.push({ at: performance.now(), delay, ceiling });
      this._timer = setTimeout(() => {
        this._timer = 0;
        if (document.hidden) { this.paused = true; return; }
        this.reconnectAttempts++;
        this.openSocket();
      }, delay);
    }
    visibility() {
      if (document.hidden) {
        if (this._timer) { clearTimeout(this._timer); this._timer = 0; this.paused = true; }
        return;
      }
      if (this.paused) {
        this.paused = false;
        this._failures = 0;
        if (!this._ws) { this.reconnectAttempts++; this.openSocket(); }
      }
    }
    async resync() {
      try {
        const page = await this.call("GET", "/v1/me/inbox?limit=" + this.pageSize());
        const fresh = new Map((page.items || []).map((m) => [m.message_id, m]));
        const oldest = page.items && page.items.length ? page.items[page.items.length - 1].message_id : "";
        // The first page as it is now, then the older ones already loaded.
        this.items = (page.items || []).concat(this.items.filter((m) => !fresh.has(m.message_id) && page.next_cursor && m.message_id < oldest));
        if (!this.items.length || !page.next_cursor) this.nextCursor = page.next_cursor || null;
        this.setCount(page.unread_count);
        this.render();
      } catch (e) {
        this.fail(e);
      }
    }
    onEvent(e) {
      const id = e.message_id || (e.message && e.message.message_id);
      if (e.type === "inbox.message" && e.message) {
        if (!this.items.some((m) => m.message_id === id)) {
          const m = Object.assign({ read: false }, e.message);
          this.items.unshift(m);
          this.items.sort((a, b) => (a.message_id < b.message_id ? 1 : -1));
          this.announce(this.t("new_one", { t: m.title }));
          this.dispatchEvent(new CustomEvent("tidings-message", { bubbles: true, composed: true, detail: { message: m } }));
        }
      } else if (/read/.test(e.type || "") && (!id || /all/.test(e.type))) {
        this.items.forEach((m) => { m.read = true; });
      } else if (/read/.test(e.type || "")) {
        this.items.forEach((m) => { if (m.message_id === id) m.read = true; });
      } else if (/archiv/.test(e.type || "")) {
        this.items = this.items.filter((m) => m.message_id !== id);
      }
      if (typeof e.unread_count === "number") {
        // Events may come late or out of order (on AWS, from the table's stream): a read or an
        // archive never raises the count, a new message never lowers it; the answers of this
        // element's own calls set it as they are.
        const n = e.type === "inbox.message" ? Math.max(this.unreadCount, e.unread_count) : Math.min(this.unreadCount, e.unread_count);
        this.setCount(n);
      }
      this.render();
    }

    /* Actions. */
    async loadMore() {
      if (!this.nextCursor) return;
      try {
        const page = await this.call("GET", `/v1/me/inbox?limit=${this.pageSize()}&cursor=${encodeURIComponent(this.nextCursor)}`);
        const have = new Set(this.items.map((m) => m.message_id));
        this.items = this.items.concat((page.items || []).filter((m) => !have.has(m.message_id)));
        this.nextCursor = page.next_cursor || null;
        this.setCount(page.unread_count);
        this.render();
      } catch (e) {
        this.fail(e);
      }
    }
    async markRead(id) {
      const m = this.items.find((x) => x.message_id === id);
      if (!m || m.read) return;
      m.read = true;
      this.render();
      try {
        const r = await this.call("POST", `/v1/me/inbox/${encodeURIComponent(id)}/read`);
        if (r && typeof r.unread_count === "number") this.setCount(r.unread_count);
      } catch (e) {
        m.read = false;
        this.fail(e);
      }
      this.render();
    }
    async markAllRead() {
      try {
        const r = await this.call("POST", "/v1/me/inbox/read-all");
        this.items.forEach((m) => { m.read = true; });
        this.setCount(r && typeof r.unread_count === "number" ? r.unread_count : 0);
      } catch (e) {
        this.fail(e);
      }
      this.render();
    }
    async archive(id) {
      try {
        const r = await this.call("POST", `/v1/me/inbox/${encodeURIComponent(id)}/archive`);
        this.items = this.items.filter((m) => m.message_id !== id);
        if (r && typeof r.unread_count === "number") this.setCount(r.unread_count);
      } catch (e) {
        this.fail(e);
      }
      this.render();
      this.$.bell.focus();
    }

    /* Rendering. */
    setCount(n) {
      n = Math.max(0, Number(n) || 0);
      if (n === this.unreadCount) return;
      this.unreadCount = n;
      this.announce(n ? this.t("unread", { n }) : this.t("none_unread"));
      this.dispatchEvent(new CustomEvent("unread-change", { bubbles: true, composed: true, detail: { unread_count: n } }));
    }
    announce(text) { this.$.live.textContent = text; }
    renderChrome() {
      const open = this.hasAttribute("open") || this.hasAttribute("inline");
      const n = this.unreadCount;
      this.$.panel.hidden = !open;
      this.$.bell.setAttribute("aria-expanded", String(open));
      this.$.bell.setAttribute("aria-label", this.t("bell", { n }));
      this.$.badge.hidden = !n;
      this.$.badge.textContent = n > 99 ? "99+" : String(n);
      this.$.h2.textContent = this.t("title");
      this.$.readAll.textContent = this.t("read_all");
      this.$.readAll.disabled = !n || this.state !== "ready";
      this.$.more.textContent = this.t("more");
      this.$.more.hidden = !this.nextCursor;
      this.dataset.state = this.state;
      this.dataset.live = String(this.live);
      const status = this.state === "error" ? this.t("error") : this.state === "loading" ? this.t("loading")
        : !this.items.length ? this.t("empty") : !this.live && this.connectAttempts ? this.t("offline") : "";
      this.$.status.textContent = status;
      this.$.status.className = this.state === "error" ? "status error" : "status muted";
      this.$.status.hidden = !status;
    }
    render() {
      this.renderChrome();
      // Re-rendering keeps the keyboard's place: the focused button of a message stays focused.
      const active = this.shadowRoot.activeElement;
      const li = active && active.closest && active.closest("li");
      const focus = li && `li[data-id="${CSS.escape(li.dataset.id)}"] .${active.className}`;
      const fmt = new Intl.DateTimeFormat(this.locale, { dateStyle: "medium", timeStyle: "short" });
      const frag = document.createDocumentFragment();
      for (const m of this.items) {
        const li = document.createElement("li");
        li.dataset.id = m.message_id;
        li.className = m.read ? "read" : "unread";
        li.setAttribute("part", "item");
        const open = document.createElement("button");
        open.className = "open";
        open.setAttribute("aria-label", (m.read ? "" : this.t("mark_read", { t: m.title }) + ". ") + m.title + ". " + m.body);
        const title = document.createElement("strong");
        title.textContent = m.title;
        const body = document.createElement("span");
        body.textContent = m.body;
        const time = document.createElement("time");
        time.dateTime = m.created_at;
        const d = new Date(m.created_at);
        time.textContent = Number.isNaN(d.getTime()) ? "" : fmt.format(d);
        open.append(title, body, time);
        const archive = document.createElement("button");
        archive.className = "archive";
        archive.textContent = this.t("archive");
        archive.setAttribute("aria-label", this.t("archive_label", { t: m.title }));
        li.append(open, archive);
        frag.append(li);
      }
      this.$.list.replaceChildren(frag);
      const again = focus && this.shadowRoot.querySelector(focus);
      if (again) again.focus();
    }
  }

  const PREFS_CSS = BASE_CSS + `
:host { display: block; background: var(--tidings-bg, #fff); border: 1px solid var(--tidings-border, #e5e7eb);
  border-radius: var(--tidings-radius, 10px); padding: 12px 16px; }
h2 { font-size: 15px; margin: 0 0 8px; }
table { border-collapse: collapse; width: 100%; }
th, td { padding: 8px 6px; text-align: center; border-bottom: 1px solid var(--tidings-border, #e5e7eb); font-size: 14px; }
th:first-child, td:first-child { text-align: left; }
thead th { font-size: 12px; font-weight: 600; color: var(--tidings-muted, #6b7280); }
.lock { font-size: 11px; color: var(--tidings-muted, #6b7280); margin-left: 6px; }
[role=switch] { position: relative; width: 36px; height: 20px; border-radius: 10px; background: var(--tidings-off, #d1d5db);
  transition: background .15s; }
[role=switch]::after { content: ""; position: absolute; top: 2px; left: 2px; width: 16px; height: 16px; border-radius: 50%;
  background: #fff; transition: left .15s; }
[role=switch][aria-checked=true] { background: var(--tidings-accent, #2563eb); }
[role=switch][aria-checked=true]::after { left: 18px; }
.status { min-height: 1.2em; margin: 8px 0 0; font-size: 13px; }
`;

  /**
   * `<tidings-preferences api token locale>`: the user's workflows (or categories) × channels as
   * switches from GET /v1/me/preferences; required ones locked; each change saved at once with PUT.
   * Events: `preferences-saved` {preferences}, `token-expiring`, `tidings-error`.
   */
  class TidingsPreferences extends Base {
    static get observedAttributes() { return ["token", "api", "locale", "expires-at"]; }
    constructor() {
      super();
      /** `loading` | `ready` | `error`. */
      this.state = "loading";
      /** The rows shown: [{kind, id, name, required, channels: {channel: on}}]. */
      this.rows = [];
      this.channels = [];
      this.saves = 0;
      this._gen = 0;
      this.shadowRoot.innerHTML = `<style>${PREFS_CSS}</style><h2></h2><table part="table"><thead></thead><tbody></tbody></table>
<p class="status muted" role="status" aria-live="polite"></p>`;
      const $ = (s) => this.shadowRoot.querySelector(s);
      this.$ = { h2: $("h2"), table: $("table"), head: $("thead"), body: $("tbody"), status: $(".status") };
      this.$.body.addEventListener("click", (e) => {
        const sw = e.target.closest("[role=switch]");
        if (sw && !sw.disabled) this.toggle(sw.dataset.kind, sw.dataset.id, sw.dataset.channel);
      });
    }
    connectedCallback() { this.load(); }
    attributeChangedCallback(name, old, value) {
      if (!this.isConnected || old === value) return;
      if (name === "locale") this.render();
      else if (name === "expires-at") this.scheduleRefresh();
      else this.load();
    }
    async load() {
      const gen = ++this._gen;
      this.state = "loading";
      this.render();
      if (!this.api || !this.token) return;
      this.scheduleRefresh();
      try {
        const p = await this.call("GET", "/v1/me/preferences");
        if (gen !== this._gen) return;
        this.take(p);
        this.state = "ready";
      } catch (e) {
        if (gen !== this._gen) return;
        this.state = "error";
        this.fail(e);
      }
      this.render();
    }
    /** The answer of GET|PUT /v1/me/preferences (the preferences and their `catalog`) as rows:
     * every channel for all messages, then each workflow on its channels, or, with no workflows,
     * each category (`{category, required}`: required ones locked). */
    take(p) {
      this.prefs = p;
      const cat = p.catalog || {};
      const chOn = p.channels || {};
      this.channels = cat.channels || ["email", "sms", "push", "inapp"];
      const all = { kind: "channel", id: "*", name: this.t("all"), required: false, channels: {} };
      for (const c of this.channels) all.channels[c] = chOn[c] !== false;
      const rows = [all];
      const wfs = cat.workflows || [];
      for (const w of wfs) {
        const pref = (p.workflows || {})[w.workflow_id];
        const row = { kind: "workflow", id: w.workflow_id, name: w.name || w.workflow_id, required: !!w.required, channels: {} };
        for (const c of w.channels || []) {
          row.channels[c] = w.required || (pref !== false && !(pref && typeof pref === "object" && pref[c] === false));
        }
        rows.push(row);
      }
      if (!wfs.length) {
        for (const entry of cat.categories || []) {
          const c = typeof entry === "string" ? entry : entry.category;
          const required = typeof entry === "string" ? c === "transactional" : !!entry.required;
          rows.push({ kind: "category", id: c, name: this.t(c), required, channels: { "*": required || (p.categories || {})[c] !== false } });
        }
      }
      this.rows = rows;
    }
    async toggle(kind, id, channel) {
      const row = this.rows.find((r) => r.kind === kind && r.id === id);
      if (!row || row.required) return;
      const on = !row.channels[channel];
      row.channels[channel] = on;
      this.render(true);
      const body = kind === "workflow" ? { workflows: { [id]: { [channel]: on } } }
        : kind === "category" ? { categories: { [id]: on } } : { channels: { [channel]: on } };
      try {
        const p = await this.call("PUT", "/v1/me/preferences", body);
        this.take(p);
        this.saves++;
        this.$.status.textContent = this.t("saved");
        this.dispatchEvent(new CustomEvent("preferences-saved", { bubbles: true, composed: true, detail: { preferences: p } }));
      } catch (e) {
        row.channels[channel] = !on;
        this.fail(e);
        this.$.status.textContent = this.t("save_failed");
      }
      this.render(true);
    }
    render(keepStatus) {
      this.$.h2.textContent = this.t("prefs");
      this.dataset.state = this.state;
      if (!keepStatus) {
        this.$.status.textContent = this.state === "error" ? this.t("prefs_error") : this.state === "loading" ? this.t("loading") : "";
      }
      this.$.status.className = this.state === "error" ? "status error" : "status muted";
      this.$.table.hidden = this.state !== "ready";
      const label = (c) => this.t(c);
      const tr = document.createElement("tr");
      const corner = document.createElement("th");
      corner.textContent = this.t("topic");
      tr.append(corner);
      for (const c of this.channels) {
        const th = document.createElement("th");
        th.scope = "col";
        th.textContent = label(c);
        tr.append(th);
      }
      this.$.head.replaceChildren(tr);
      const frag = document.createDocumentFragment();
      for (const r of this.rows) {
        const row = document.createElement("tr");
        const th = document.createElement("th");
        th.scope = "row";
        th.textContent = r.name;
        if (r.required) {
          const lock = document.createElement("span");
          lock.className = "lock";
          lock.innerHTML = LOCK_SVG;
          lock.append(" " + this.t("required"));
          th.append(lock);
        }
        row.append(th);
        const cells = "*" in r.channels ? ["*"] : this.channels;
        for (const c of cells) {
          const td = document.createElement("td");
          if (c === "*") td.colSpan = this.channels.length;
          if (c in r.channels) {
            const sw = document.createElement("button");
            sw.setAttribute("role", "switch");
            sw.setAttribute("aria-checked", String(r.channels[c]));
            sw.setAttribute("aria-label", r.name + (c === "*" ? "" : `: ${label(c)}`) + (r.required ? ` (${this.t("required")})` : ""));
            Object.assign(sw.dataset, { kind: r.kind, id: r.id, channel: c });
            sw.disabled = r.required;
            td.append(sw);
          }
          row.append(td);
        }
        frag.append(row);
      }
      const active = this.shadowRoot.activeElement;
      this.$.body.replaceChildren(frag);
      if (active && active.dataset && active.dataset.kind) {
        const d = active.dataset;
        const again = this.shadowRoot.querySelector(
          `[role=switch][data-kind="${d.kind}"][data-id="${CSS.escape(d.id)}"][data-channel="${d.channel}"]`);
        if (again) again.focus();
      }
    }
  }

  customElements.define("tidings-inbox", TidingsInbox);
  customElements.define("tidings-preferences", TidingsPreferences);
})();
