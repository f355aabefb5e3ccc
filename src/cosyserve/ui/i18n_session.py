"""Chinese and English strings of the session watch: the bar a page shows when its browser's sign-in has
ended or is now another identity's (`ui/assets.py`, `ui/app.py`), and of an upload the page outlived;
merged into `i18n.STRINGS`."""

from __future__ import annotations

SESSION_STRINGS: dict[str, tuple[str, str]] = {
    "signed_out": ("未登录", "Not signed in"),
    "session_ended": (
        "登录已结束（已退出登录、已过期，或密钥已被吊销）：重新登录之前，本页的操作都不会生效。",
        "Your sign-in has ended (logged out, expired, or the key was revoked): nothing on this page works "
        "until you sign in again.",
    ),
    "session_sign_in": ("重新登录", "Sign in again"),
    "session_switched": (
        "此浏览器已在另一个标签页登录为 {name}：本页现在以 {name} 的身份操作，"
        "但页面上的音色和记录仍是之前身份的。",
        "This browser is now signed in as {name} (in another tab): this page now acts as {name}, but the "
        "voices and history it shows are still the earlier identity's.",
    ),
    "session_reload": ("重新加载本页", "Reload this page"),
    # a recording cloned, or a voice enrolled, without the consent box ticked (the API's message names
    # API fields; this one the page's box)
    "err_consent": (
        "请先勾选同意确认（录音下方，或添加音色表单中的复选框）：被克隆声音的本人已另行同意。",
        "Tick the consent box first (under the recording, or in the enrol form): the person whose voice "
        "it is must have agreed separately.",
    ),
    # the enrol form without a recording (it has no saved-voice picker, unlike the Generate tabs)
    "err_no_recording": (
        "没有录音：请上传或录制 3–30 秒要保存的声音。",
        "No recording: upload or record 3-30 s of the voice to save.",
    ),
    # an upload the page still shows, whose file the server's cache dropped (it expired, or was cleaned)
    "err_upload_gone": (
        "服务器上已找不到这次上传的音频（上传已过期）：请重新上传或录制。",
        "The server no longer has this uploaded recording (the upload expired): upload or record it again.",
    ),
    # a voice name the server cannot take, or one the user already has (enrol, rename)
    "err_voice_name": (
        "音色名称须为 1–64 个汉字、字母（任何文字）、数字、空格、“-”“_”“.”或“・”，且不能只有符号。",
        "A voice name is 1-64 letters (of any script, Chinese characters too), digits, spaces, '-', '_', "
        "'.' or '・', and not only symbols.",
    ),
    "err_voice_in_use": (
        "这个音色正被排队或运行中的工作使用（批量、长文本或配音）：等它结束，或在相应页签中取消，再删除或更改音色。",
        "This voice is used by work that is queued or running (a batch, a long text or a dub): wait for it "
        "to end, or cancel it in its tab, then delete or change the voice.",
    ),
    "err_voice_name_taken": (
        "你已有同名的音色：请换一个名称，或先删除那个音色。",
        "You already have a voice of that name: pick another name, or delete that voice first.",
    ),
    # History: Delete with no entry picked (a delete leaves none picked, so a second click deletes nothing)
    "history_pick_first": ("请先在列表中选择一条记录。", "Pick an entry in the list first."),
    # History: the entry to delete was already gone (deleted in another tab, or expired)
    "history_gone": (
        "这条记录已不存在（已被删除或已过期），列表已更新。",
        "That entry no longer exists (deleted or expired); the list is updated.",
    ),
    # a history entry or result the page still lists, deleted since (in another tab) or expired
    "err_output_gone": (
        "这条结果已不存在（已被删除或已过期）：请点击“刷新”更新列表。",
        "This result no longer exists (it was deleted or expired): press Refresh to update the list.",
    ),
}
