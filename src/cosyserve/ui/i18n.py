"""Chinese and English strings of the web UI, and the registry that switches a page between them.

Every translatable property of a component is bound once (`Translator.bind`); switching the language
returns one `gr.update` per bound component, so nothing is rebuilt. Strings live in `STRINGS` as
`key: (zh, en)`; `{name}` placeholders are filled by `text(key, lang, name=...)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cosyserve.ui.i18n_admin import ADMIN_STRINGS
from cosyserve.ui.i18n_history import HISTORY_STRINGS
from cosyserve.ui.i18n_jobs import JOB_STRINGS
from cosyserve.ui.i18n_session import SESSION_STRINGS

LANGS = ("zh", "en")
DEFAULT_LANG = "zh"
LANG_CHOICES = [("中文", "zh"), ("English", "en")]

STRINGS: dict[str, tuple[str, str]] = {
    # header and banners
    "title": ("CosyVoice3 语音工作室", "CosyVoice3 Studio"),
    "subtitle": (
        "声音复刻、跨语种与自然语言控制的语音合成",
        "Voice cloning, cross-lingual and instruction-controlled speech synthesis",
    ),
    "language": ("语言", "Language"),
    "signed_in": ("已登录：{name}", "Signed in as {name}"),
    "anonymous": ("未启用登录（仅限本机）", "No login configured (local use)"),
    "logout": ("退出登录", "Log out"),
    "demo_banner": (
        "演示模型已加载：权重是随机的，生成的音频只是噪声。用 --model 指定真实模型。",
        "The demo model is loaded: its weights are random, so every result is noise. "
        "Serve a real model with --model.",
    ),
    "model_loading": ("模型加载中，请稍候……", "The model is loading, please wait…"),
    "model_restarting": ("模型正在重新加载……", "The model is reloading…"),
    "model_failed": ("模型加载失败：{reason}", "The model failed to load: {reason}"),
    "model_ready": ("模型就绪：{model}（{device}）", "Model ready: {model} ({device})"),
    # tabs
    "tab_zero_shot": ("3秒极速复刻", "Zero-shot clone"),
    "tab_cross_lingual": ("跨语种复刻", "Cross-lingual"),
    "tab_instruct": ("自然语言控制", "Instruct"),
    "tab_voices": ("音色库", "Voice library"),
    "tab_history": ("历史记录", "History"),
    "tab_admin": ("管理", "Admin"),
    "about_zero_shot": (
        "上传或录制 3–30 秒的参考音频并填写其文本，即可用该声音朗读任意文字。",
        "Upload or record 3-30 s of a voice and type what it says: any text is then read in that voice.",
    ),
    "about_cross_lingual": (
        "只需参考音频，无需文本：用该声音说另一种语言（例如中文参考音频说英文）。",
        "Only the recording, no transcript: the voice speaks another language (e.g. a Chinese "
        "recording reading English).",
    ),
    "about_instruct": (
        "用自然语言描述方言、情感、语速或音量，例如「请用四川话表达。」。",
        "Describe a dialect, emotion, speed or volume in plain words, e.g. “请用四川话表达。”.",
    ),
    # voice source
    "saved_voice": ("已保存的音色", "Saved voice"),
    "saved_voice_info": (
        "选择后将使用该音色，而不是下面的录音",
        "When set, this voice is used instead of the recording below",
    ),
    "no_voice": ("（不使用，用下面的录音）", "(none: use the recording below)"),
    "prompt_audio": ("参考音频（上传或录音，3–30 秒）", "Voice prompt (upload or record, 3-30 s)"),
    "transcript": ("参考音频的文本", "Transcript of the prompt"),
    "transcript_ph": ("参考音频里说的话，逐字填写", "Exactly what is said in the recording"),
    "prompt_none": ("还没有参考音频。", "No prompt yet."),
    "prompt_ok": ("✓ 参考音频可用", "✓ Prompt looks usable"),
    "prompt_bad": ("✗ 参考音频不可用", "✗ This prompt can't be used"),
    "prompt_warn": ("⚠ 参考音频可用，但请注意", "⚠ Usable, but note"),
    "prompt_stats": (
        "时长 {duration:.1f} 秒（语音 {speech:.1f} 秒）· 峰值 {peak:.1f} dBFS · 电平 {rms:.1f} dBFS"
        " · {rate} Hz",
        "{duration:.1f} s ({speech:.1f} s of speech) · peak {peak:.1f} dBFS · level {rms:.1f} dBFS"
        " · {rate} Hz",
    ),
    # instruct
    "preset": ("预设指令", "Preset"),
    "preset_none": ("（无预设）", "(no preset)"),
    "instruct_text": ("自由指令（填写后优先于预设）", "Free instruction (wins over the preset)"),
    "instruct_ph": ("例如：请用温柔的语气慢慢地说。", "e.g. Please speak slowly and gently."),
    "group_dialect": ("方言", "Dialect"),
    "group_emotion": ("情感", "Emotion"),
    "group_speed": ("语速", "Speed"),
    "group_volume": ("音量", "Volume"),
    "group_role": ("角色", "Role"),
    # text and controls
    "text": ("要合成的文本", "Text to speak"),
    "text_ph": ("输入要朗读的文字……", "Type what the voice should say…"),
    "help_title": ("发音与标记帮助", "Pronunciation and tag help"),
    "examples": ("示例", "Examples"),
    "seed": ("随机种子", "Seed"),
    "seed_ph": ("留空则随机；填写同一数字可复现结果", "empty: random; the same number reproduces a result"),
    "dice": ("⚄ 随机", "⚄ Random"),  # words too: "⚄" alone was read as "die face-5" or nothing
    "speed": ("语速", "Speed"),
    "volume": ("音量", "Volume"),
    "takes": ("生成次数（不合格则换种子重做）", "Takes (made again with the next seed if a check fails)"),
    "stream": ("流式播放（边生成边播放）", "Stream (plays while it is generated)"),
    "stream_info": (
        "生成次数大于 1 时不流式：不合格的结果先重做再播放",
        "Not with more than 1 take: a take that fails a check is made again before it plays",
    ),
    "generate": ("生成音频", "Generate"),
    "cancel": ("取消", "Cancel"),
    "result": ("生成结果", "Result"),
    "download": ("下载 {fmt}", "Download {fmt}"),
    "result_info": (
        "种子 {seed} · 时长 {duration:.2f} 秒 · 用时 {elapsed:.1f} 秒",
        "Seed {seed} · {duration:.2f} s of audio · took {elapsed:.1f} s",
    ),
    "queued": ("排队中（前面还有 {position} 个，约 {wait} 秒）", "Queued ({position} ahead, about {wait} s)"),
    "queued_next": ("下一个就轮到你（约 {wait} 秒后开始）", "Next in line: starts in about {wait} s"),
    "generating": ("生成中……", "Generating…"),
    "streaming": ("生成中：已生成 {seconds:.1f} 秒音频", "Generating: {seconds:.1f} s of audio so far"),
    "cancelled": ("已取消。", "Cancelled."),
    # text preview
    "preview_title": ("发音/文本预览", "Pronunciation / text preview"),
    "preview_btn": ("预览读法", "Preview reading"),
    "pv_spoken": ("实际朗读：", "Spoken as:"),
    "pv_corrections": ("与官方读法不同之处：", "Read differently from the official frontend:"),
    "pv_mode": ("模式：", "Mode:"),
    "pv_instruction": ("使用的指令", "instruction used"),
    "pv_sentences": ("分句（共 {count} 句）：", "Sentences ({count}):"),
    "pv_timing_later": ("（生成后显示时间）", "(timing after generating)"),
    "pv_tokens": ("模型读到的 token", "Tokens the model reads"),
    # voice source, cleanup and transcription
    "voice_note_zero_shot": (
        "正在使用已保存的音色「{name}」：使用它的录音和文本「{transcript}」，下方的上传和文本框已停用。"
        "选择「（不使用）」可改用自己的录音。",
        "Using the saved voice “{name}”: its recording and its transcript “{transcript}” are used; the "
        "upload and transcript fields below are off. Choose “(none)” to use your own recording.",
    ),
    "voice_note_other": (
        "正在使用已保存的音色「{name}」的录音，下方的上传已停用。选择「（不使用）」可改用自己的录音。",
        "Using the recording of the saved voice “{name}”; the upload below is off. Choose “(none)” to use "
        "your own recording.",
    ),
    "no_transcript": ("（无文本）", "(no transcript)"),
    "transcript_private": (
        "（共享音色的文本仅其所有者可见）",
        "(a shared voice's transcript is for its owner only)",
    ),
    "denoise": ("降噪（RNNoise，默认关闭）", "Noise reduction (RNNoise, off by default)"),
    "denoised_audio": (
        "降噪后（与上方原始录音对比）",
        "After noise reduction (compare with the original above)",
    ),
    "transcribe": ("自动识别文本", "Transcribe"),
    "prompt_snr": ("信噪比约 {snr:.0f} dB", "SNR about {snr:.0f} dB"),
    # optional parts (noise reduction, prompt transcription): what is installed, how to add the rest
    "parts_title": ("可选组件", "Optional parts"),
    "part_denoise": ("降噪（RNNoise）", "Noise reduction (RNNoise)"),
    "part_asr": ("参考音频自动识别（SenseVoice）", "Prompt transcription (SenseVoice)"),
    "part_on": ("✓ {label}：已安装", "✓ {label}: installed"),
    "part_off": (
        "✗ {label}：未安装（{missing}）。服务器管理员安装方法：{commands}，然后重启服务。",
        "✗ {label}: not installed ({missing}); the server's admin adds it with {commands}, then restarts "
        "the server.",
    ),
    "part_package": ("缺少软件包", "package missing"),
    "part_model": ("缺少模型", "model missing"),
    "part_list": ("、", ", "),
    "part_then": (" 然后 ", " then "),
    "instruct_mapped": ("将使用训练时的指令：「{wording}」", "The trained wording is used: “{wording}”"),
    "mode_preview": ("试听", "preview"),
    "subtitles": ("字幕 SRT", "Subtitles SRT"),
    "err_job_too_long": (
        "文本有 {count} 个字符，超过任务上限 {limit}：请分成几部分。",
        "The text has {count} characters, over the job limit of {limit}: split it into parts.",
    ),
    # errors
    "error_title": ("无法完成", "Could not do that"),
    "err_no_prompt": (
        "没有参考音频：请上传或录制 3–30 秒的声音，或选择一个已保存的音色。",
        "No voice prompt: upload or record 3-30 s of a voice, or pick a saved voice.",
    ),
    "err_voice_gone": (
        "所选音色已不存在（可能已被删除）：请在列表中重新选择一个音色。",
        "The selected voice no longer exists (it may have been deleted): pick another voice from the list.",
    ),
    "err_no_transcript": (
        "3秒极速复刻需要参考音频的文本：请填写录音里说的话（或改用跨语种复刻）。",
        "Zero-shot cloning needs the prompt's transcript: type what the recording says "
        "(or use the cross-lingual tab).",
    ),
    "err_no_instruct": (
        "请选择一个预设指令或填写自由指令。",
        "Pick a preset or type an instruction.",
    ),
    "err_seed": (
        "种子必须是 0 到 {limit} 之间的整数。",
        "The seed must be a whole number from 0 to {limit}.",
    ),
    "err_takes": (
        "生成次数必须是 1 到 {limit} 之间的整数。",
        "Takes must be a whole number from 1 to {limit}.",
    ),
    "err_no_text": ("请输入要合成的文本。", "Type the text to speak."),
    "err_too_long": (
        "文本有 {count} 个字符，超过上限 {limit}：请缩短或分段。",
        "The text has {count} characters, over the limit of {limit}: shorten it or split it.",
    ),
    "err_queue_full": (
        "服务器繁忙，队列已满：请约 {seconds} 秒后重试。",
        "The server is busy and its queue is full: try again in about {seconds} s.",
    ),
    "err_not_ready": (
        "模型尚未就绪（正在加载或重新加载）：请稍后重试。",
        "The model is not ready yet (loading or reloading): try again shortly.",
    ),
    "err_auth": ("登录已失效：请重新登录。", "Your login has expired: log in again."),
    "err_admin": ("此操作需要管理员权限。", "This needs an admin login."),
    "err_rate": ("请求过于频繁：{message}", "Too many requests: {message}"),
    "err_timeout": ("生成超时：{message}", "Synthesis took too long: {message}"),
    "err_internal": (
        "服务器内部错误（请求 ID {request_id}），详情见服务器日志。",
        "Something went wrong on the server (request id {request_id}); the server log has details.",
    ),
    "err_bad_file": (
        "不支持的文件类型 {suffix}：请上传 {formats} 格式的音频（M4A、AAC、WebM 请先转换为 WAV 或 MP3）。",
        "Unsupported file type {suffix}: upload {formats} audio (convert M4A, AAC, WebM to WAV or MP3).",
    ),
    "err_big_file": (
        "文件太大（{size:.1f} MB）：上限为 {limit:.0f} MB。",
        "The file is too large ({size:.1f} MB): the limit is {limit:.0f} MB.",
    ),
    # voice library
    "voices_list": ("已保存的音色", "Saved voices"),
    "voice_cols": (
        "名称|文本|归属|同意|创建时间|时长（秒）|提示",
        "Name|Transcript|Access|Consent|Created|Seconds|Notes",
    ),
    "consent_given": ("✓ {by}，{at}", "✓ {by}, {at}"),
    "consent_label": ("同意确认（{need}）", "Consent ({need})"),
    "consent_recording": (
        "录音的同意确认（{need}；已保存的音色不需要）",
        "Consent for this recording ({need}; not for a saved voice)",
    ),
    "consent_needed": ("必填", "required"),
    "consent_optional": ("管理员可选", "optional for admins"),
    "voice_own": ("我的", "yours"),
    "voice_own_shared": ("我的 · 已共享", "yours · shared"),
    "voice_shared": ("共享", "shared"),
    "voice_private_of": ("私有（{owner}）", "private ({owner})"),
    "enrol_title": ("添加新音色", "Enrol a new voice"),
    "voice_name": ("音色名称", "Voice name"),
    "voice_name_ph": ("例如：小明", "e.g. alice"),
    "enrol": ("保存音色", "Save voice"),
    "enrolled": ("已保存音色「{name}」。", "Saved the voice “{name}”."),
    "pick_voice": ("选择音色", "Choose a voice"),
    "preview_text": ("试听文本（留空则播放原始录音）", "Preview text (empty: the original recording)"),
    "preview": ("试听", "Preview"),
    "new_name": ("新名称", "New name"),
    "rename": ("重命名", "Rename"),
    "renamed": ("已重命名为「{name}」。", "Renamed to “{name}”."),
    "delete": ("删除", "Delete"),
    "confirm_delete": ("确认删除", "Confirm delete"),
    "deleted": ("已删除音色「{name}」。", "Deleted the voice “{name}”."),
    "use_voice": ("用于合成", "Use for synthesis"),
    "using_voice": ("已在各合成页选中音色「{name}」。", "“{name}” is now selected in the synthesis tabs."),
    "refresh": ("刷新", "Refresh"),
    "select_first": ("请先选择一个音色。", "Choose a voice first."),
    # history
    "history_owner": ("所有者", "Owner"),
    "history_cols": (
        "时间|模式|文本|音色|种子|时长（秒）|编号",
        "Time|Mode|Text|Voice|Seed|Seconds|Id",
    ),
    "history_pick": ("选择一条记录", "Choose an entry"),
    "history_audio": ("选中的结果", "Selected result"),
    "history_params": ("参数", "Parameters"),
    "rerun": ("重新生成", "Re-run"),
    "rerun_loaded": (
        "参数已填入「{tab}」页。该结果使用了上传的录音：请在该页重新上传后点击生成。",
        "The parameters are in the “{tab}” tab. This result used an uploaded recording: load it "
        "there again and press Generate.",
    ),
    "history_empty": ("还没有生成记录。", "Nothing generated yet."),
    "mode_zero_shot": ("极速复刻", "zero-shot"),
    "mode_cross_lingual": ("跨语种", "cross-lingual"),
    "mode_instruct": ("指令控制", "instruct"),
    "mode_api": ("API", "API"),
    "uploaded": ("（上传的录音）", "(uploaded recording)"),
    "mode_batch": ("批量", "batch"),
    "mode_dub": ("配音", "dub"),
    # admin
    "engine_status": ("引擎状态", "Engine status"),
    "restart_engine": ("重启引擎", "Restart engine"),
    "restarting": ("正在重新加载模型……", "Reloading the model…"),
    "confirm_restart": ("确认重启", "Yes, restart"),
    "keep_running": ("不重启", "Keep running"),
    "restart_question": (
        "重启会释放并重新加载模型：排队的请求会等待，正在运行的请求先完成。确定要重启吗？",
        "Restarting frees and reloads the model: queued requests wait, running ones finish first. "
        "Restart now?",
    ),
    "gpu_title": ("GPU（NVML）", "GPUs (NVML)"),
    "gpu_cols": ("#|名称|占用|已用显存|可用显存|总显存|温度", "#|Name|Busy|Used|Free|Total|Temp"),
    "gpu_none": ("没有可显示的 GPU：{reason}", "No GPU to show: {reason}"),
    "engine_allocator": (
        "引擎（{device}）的 PyTorch 分配：已分配 {allocated_mb} MB，已预留 {reserved_mb} MB",
        "The engine's PyTorch allocator on {device}: {allocated_mb} MB allocated, {reserved_mb} MB reserved",
    ),
    "activity_title": ("最近的请求", "Recent activity"),
    "activity_cols": (
        "时间|事件|结果|调用者|模式|字数|音频秒|RTF|设备|请求 ID",
        "Time|Event|Result|Who|Mode|Chars|Audio s|RTF|Device|Request id",
    ),
    "activity_none": ("还没有请求。", "Nothing has run yet."),
    "adm_cols": ("项目|值", "Item|Value"),
    "adm_state": ("状态", "State"),
    "adm_model": ("模型", "Model"),
    "adm_device": ("设备", "Device"),
    "adm_process_memory": ("进程内存", "Process memory"),
    "adm_queue": ("队列", "Queue"),
    "adm_queue_value": (
        "等待 {queued} / {size}，运行 {running} / {slots}",
        "{queued} / {size} waiting, {running} / {slots} running",
    ),
    "adm_finished": ("已完成", "Finished"),
    "adm_mean": ("平均耗时", "Mean duration"),
    "adm_outputs": ("输出存储", "Output store"),
    "adm_uptime": ("运行时间", "Uptime"),
    "logs": ("最近日志", "Recent logs"),
    "log_level": ("日志级别", "Log level"),
}

STRINGS.update(ADMIN_STRINGS)  # the admin tab's keys, quotas and enrolments (kept in their own module)
STRINGS.update(SESSION_STRINGS)  # the session watch's bar
STRINGS.update(JOB_STRINGS)  # a long text made as a job
STRINGS.update(HISTORY_STRINGS)  # the History tab's search and filters


def text(key: str, lang: str, **values: Any) -> str:
    """The string `key` in `lang` (zh or en), with `{placeholders}` filled from `values`."""
    zh, en = STRINGS[key]
    template = zh if lang == "zh" else en
    return template.format(**values) if values else template


def pick_lang(saved: str | None, accept_language: str | None) -> str:
    """The page language: the user's saved choice, else the browser's first zh/en preference, else zh."""
    if saved in LANGS:
        return saved
    for part in (accept_language or "").split(","):
        tag = part.split(";")[0].strip().lower()
        if tag.startswith("zh"):
            return "zh"
        if tag.startswith("en"):
            return "en"
    return DEFAULT_LANG


Prop = str | Callable[[str], Any]  # a STRINGS key, or a function of the language


class Translator:
    """Remembers which component property shows which string, and updates them all for a language."""

    def __init__(self, lang: str = DEFAULT_LANG) -> None:
        self.lang = lang  # the language components are first rendered in
        self._bound: list[tuple[Any, dict[str, Prop]]] = []

    def __call__(self, key: str, **values: Any) -> str:
        return text(key, self.lang, **values)

    def bind(self, component: Any, **props: Prop) -> Any:
        """Record `component`'s translatable properties (label=key, choices=fn, ...); returns it."""
        self._bound.append((component, props))
        return component

    @property
    def components(self) -> list[Any]:
        return [component for component, _ in self._bound]

    def updates(self, lang: str) -> list[dict[str, Any]]:
        """One `gr.update` per bound component, in `components` order."""
        import gradio as gr

        result = []
        for _, props in self._bound:
            values = {
                name: (prop(lang) if callable(prop) else text(prop, lang)) for name, prop in props.items()
            }
            result.append(gr.update(**values))
        return result
