"""Chinese and English strings of a long text made as a job in the studio (`ui/long_text.py`): its note,
progress line and queue place, and how it ended; merged into `i18n.STRINGS`."""

from __future__ import annotations

JOB_STRINGS: dict[str, tuple[str, str]] = {
    "long_text_job": (
        "文本有 {count} 个字符，超过单次上限 {limit}：作为后台任务分段生成。",
        "The text has {count} characters, over the limit of {limit} for one request: it is made as a job.",
    ),
    "job_progress": (
        "已完成 {done} / {total} 句 · 已用 {elapsed} · 预计剩余 {remaining}",
        "{done} / {total} sentences · {elapsed} elapsed · about {remaining} left",
    ),
    "job_queued": ("任务排队中……", "The job is queued…"),
    "job_queued_eta": (
        "任务排队中（前面还有 {position} 个，约 {wait} 秒后开始）……",
        "The job is queued ({position} ahead, starts in about {wait} s)…",
    ),
    "cancel_too_late": (
        "取消时已生成完毕：结果已保存（见历史记录）。",
        "It had finished before the cancel arrived: the result was kept (see History).",
    ),
    "job_kept_partial": (
        "已保留完成的部分：{done} / {total} 段（{seconds:.1f} 秒），从第 {missing} 段起缺失。",
        "What was made is kept: {done} of {total} parts ({seconds:.1f} s), missing from part {missing} on.",
    ),
}
