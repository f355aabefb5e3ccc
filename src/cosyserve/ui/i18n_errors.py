"""Chinese leads for the service's errors that have no translated sentence of their own.

Such an error's message (what was wrong, what to do) is the service's English text: on the Chinese page
it follows a lead that says the same in Chinese in general terms, so a reader without English still
knows what happened and whether to wait, fix the input or ask the admin. The English page shows the
message alone. Every code of the error table without a `ui_key` has a lead (a test holds that).
"""

from __future__ import annotations

ZH_LEADS: dict[str, str] = {
    "voice_not_found": "音色的文件缺失，请联系管理员",
    "key_not_found": "找不到这个密钥",
    "model_not_found": "找不到这个模型",
    "job_not_found": "找不到这个任务",
    "payload_too_large": "上传的内容太大",
    "body_timeout": "上传中断了，请重试",
    "unsupported_media_type": "不支持这种文件格式",
    "out_of_memory": "服务器内存不足，请稍后重试",
    "storage_error": "保存结果时出错，请联系管理员",
    "no_workers": "现在没有可用的合成节点，请稍后重试",
    "worker_lost": "合成节点中途失联，请重试",
    "queue_unavailable": "任务队列暂时无法连接，请稍后重试",
    "storage_unavailable": "存储暂时无法连接，请稍后重试",
    "shutting_down": "服务正在重启或关闭，请稍后重试",
    "conflict": "操作与当前状态冲突",
    "invalid_input": "输入无法使用",
    "model_unavailable": "模型不可用，请联系管理员",
    "settings": "服务器设置有误，请联系管理员",
    "key_revoked": "密钥已被吊销，请重新登录",
    "key_changed": "账号权限已变更，请重新登录",
    "voice_unavailable": "音色暂时不可用",
    "voice_in_use": "音色正被使用，暂时不能更改",
    "missing_extra": "服务器缺少所需组件，请联系管理员",
    "unavailable": "所需的服务不可用，请联系管理员",
}


def with_lead(code: str, message: str, lang: str) -> str:
    """`message` as the page shows it: after its Chinese lead on the Chinese page."""
    lead = ZH_LEADS.get(code) if lang == "zh" else None
    return f"{lead}（{message}）" if lead and message else (lead or message)
