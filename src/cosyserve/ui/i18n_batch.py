"""Chinese and English strings of the Batch tab (`ui/batch_tab.py`, which fills them with `bt`)."""

from __future__ import annotations

STRINGS: dict[str, tuple[str, str]] = {
    "tab": ("批量与配音", "Batch"),
    "about": (
        "上传脚本（CSV 需含 text 列；TXT 每行一句；JSONL）批量生成，"
        "或上传字幕（SRT、WebVTT）生成对齐时间轴的配音。"
        "任务在服务器上运行：关闭页面后仍会继续，服务器重启后从中断处接着做。",
        "Upload a script (CSV with a `text` column, TXT with one line per item, JSONL) to voice every "
        "line, or subtitles (SRT, WebVTT) for a voice-over timed to the cues. It runs on the server: it "
        "goes on if you close the page, and resumes after a restart.",
    ),
    "file": ("脚本或字幕文件", "Script or subtitle file"),
    "voice": ("音色", "Voice"),
    "instruct": ("指令（可选，用于每一句）", "Instruction (optional, for every line)"),
    "format": ("格式", "Format"),
    "max_speed": ("字幕配音：最多加速到", "Subtitles: speed a line up at most"),
    "takes": ("每一项的生成次数（不合格则换种子重做）", "Takes per item (made again if a check fails)"),
    "start": ("开始", "Start"),
    "cancel": ("取消剩余", "Cancel the rest"),
    "pick": ("播放已完成的一项", "Play a finished item"),
    "audio": ("试听", "Listen"),
    "cols": ("序号|名称|状态|时长（秒）|检查|错误", "#|Name|State|Seconds|Check|Error"),
    "check_passed": ("✓", "✓"),
    "check_listen": ("⚠ 请试听：{failed}", "⚠ listen: {failed}"),
    "item_deleted": ("音频已被删除。", "Its audio was deleted."),
    "item_no_voice": (
        "没有名为 {voice} 的音色：这一行要用音色库里你的音色或共享音色的名称。",
        "No voice named {voice}: a line's voice must be one of yours or a shared one in the Voice library.",
    ),
    "no_file": ("请先上传脚本或字幕文件。", "Upload a script or a subtitle file first."),
    "no_voice": ("请选择一个已保存的音色。", "Pick a saved voice first."),
    "progress": (
        "{finished} / {total} 已处理 · {done} 完成 · {failed} 失败",
        "{finished} / {total} finished · {done} done · {failed} failed",
    ),
    "cancelled_n": ("{n} 已取消", "{n} cancelled"),
    "left": ("约剩 {seconds:.0f} 秒", "about {seconds:.0f} s left"),
    "state_queued": ("排队中", "queued"),
    "state_running": ("进行中", "running"),
    "state_done": ("完成", "done"),
    "state_failed": ("失败", "failed"),
    "state_cancelled": ("已取消", "cancelled"),
    "zip": ("下载 ZIP", "Download ZIP"),
    "track": ("下载配音", "Download the track"),
    "report": ("时间轴报告 (CSV)", "Timing report (CSV)"),
    "recent": (
        "我的批量任务（选择一项查看进度、试听和下载）",
        "Your batches (pick one for its progress, items and downloads)",
    ),
    "recent_item": ("{when} · {kind} · {items} 项 · {state}", "{when} · {kind} · {items} items · {state}"),
    "kind_batch": ("脚本", "script"),
    "kind_dub": ("字幕配音", "subtitles"),
}
