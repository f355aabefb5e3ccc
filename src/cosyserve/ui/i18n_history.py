"""The History tab's search and filter strings (`key: (zh, en)`, merged into `i18n.STRINGS`)."""

from __future__ import annotations

HISTORY_STRINGS: dict[str, tuple[str, str]] = {
    "history_search": ("搜索（文本或编号）", "Search (text or id)"),
    "history_voice": ("音色", "Voice"),
    "history_kind": ("类型", "Kind"),
    "history_day": ("日期", "Date"),
    "history_any": ("全部", "All"),
    "history_everyone": ("所有用户的记录", "Everyone's entries"),
    "history_delete": ("删除这条记录", "Delete this entry"),
    "history_deleted": ("已删除 {id}。", "Deleted {id}."),
    "history_no_match": ("没有符合筛选条件的记录。", "No entry matches the filters."),
    "history_searched_newest": (
        "（只搜索了最新的 {count} 条结果。）",
        "(Only the newest {count} results were searched.)",
    ),
    "history_download": ("⬇ 下载 {fmt}", "⬇ Download {fmt}"),
}
