"""Chinese and English strings of the admin tab's API keys, quotas, enrolment list and durations, merged
into `i18n.STRINGS` (same `key: (zh, en)` form, same placeholders rule)."""

from __future__ import annotations

ADMIN_STRINGS: dict[str, tuple[str, str]] = {
    "unit_d": ("天", "d"),
    "unit_h": ("小时", "h"),
    "unit_min": ("分钟", "min"),
    "unit_s": ("秒", "s"),
    "keys_title": ("API 密钥与配额", "API keys and quotas"),
    "keys_cols": (
        "ID|名称|前缀|角色|状态|今日已用（UTC）|预留中|每日配额|最近使用",
        "Id|Name|Prefix|Role|State|Used today (UTC)|Reserved|Daily quota|Last used",
    ),
    "keys_none": ("还没有 API 密钥。", "No API keys yet."),
    "keys_unlimited": ("不限", "unlimited"),
    "key_active": ("有效", "active"),
    "key_revoked": ("已吊销", "revoked"),
    "key_name": ("新密钥名称", "New key name"),
    "key_role": ("角色", "Role"),
    "key_quota": (
        "每日配额（音频秒数，0 或留空为服务器默认）",
        "Daily quota (audio seconds; 0 or empty: server default)",
    ),
    "key_create": ("创建密钥", "Create key"),
    "key_created": (
        "已创建密钥 **{name}**（ID {id}）。请立即复制，它只显示这一次：",
        "Created key **{name}** (id {id}). Copy it now: it is shown only this once:",
    ),
    "key_pick": ("密钥", "Key"),
    "key_revoke": ("吊销", "Revoke"),
    "key_revoke_question": (
        "吊销密钥 {name}（ID {id}）？用它的请求、任务和批量会停止，"
        "用它登录的浏览器会被登出；此操作不能撤销。",
        "Revoke key {name} (id {id})? Its requests, jobs and batches stop, browsers signed in with it are "
        "signed out, and this can't be undone.",
    ),
    "key_revoke_confirm": ("确认吊销", "Yes, revoke it"),
    "key_keep": ("保留", "Keep it"),
    "key_revoked_msg": (
        "密钥 {name}（ID {id}）已吊销，其正在运行的任务也会停止。",
        "Key {name} (id {id}) is revoked; its running work stops too.",
    ),
    "key_rotate": ("换新密钥", "New secret"),
    "key_rotate_question": (
        "给密钥 {name}（ID {id}）换一个新密钥？旧密钥立即失效，用它登录的浏览器会被登出；"
        "它的音色、输出、任务和用量保持不变。",
        "Give key {name} (id {id}) a new secret? The old one stops working at once and browsers signed in "
        "with it are signed out; its voices, outputs, jobs and usage stay its own.",
    ),
    "key_rotate_confirm": ("确认换新", "Yes, give it a new secret"),
    "key_rotated": (
        "密钥 **{name}**（ID {id}）已换新。请立即复制，它只显示这一次：",
        "Key **{name}** (id {id}) has a new secret. Copy it now: it is shown only this once:",
    ),
    "key_rotated_own": (
        "这是你登录所用的密钥：请复制上面的新密钥，再用它重新登录。",
        "This is the key you signed in with: copy the new key above, then sign in again with it.",
    ),
    "key_set_quota": ("设置配额", "Set quota"),
    "key_quota_set": ("密钥 {name} 的每日配额：{quota}", "Daily quota of key {name}: {quota}"),
    "key_pick_first": ("请先选择一个密钥。", "Choose a key first."),
    "key_quota_bad": (
        "配额必须是非负的秒数，得到 {value}。",
        "The quota must be a number of seconds >= 0, got {value}.",
    ),
    "enrolments_title": ("音色登记记录", "Enrolments"),
    "enrolments_cols": ("音色|所有者|登记人|同意时间|共享", "Voice|Owner|Enrolled by|Consent date|Shared"),
    "enrolments_none": ("还没有登记的音色。", "No voices enrolled yet."),
    "owner_nobody": ("（无）", "(none)"),
    "consent_missing": ("（未记录）", "(not recorded)"),
    "yes": ("是", "yes"),
    "no": ("否", "no"),
    "restart_settled": ("重启完成，引擎状态：{state}", "Restart finished; the engine is {state}"),
}
