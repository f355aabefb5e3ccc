"""How cosyserve reads written forms, case by case, against how the official normaliser reads them.

Each case: category, what a user types, what a native speaker says (written by hand, in the wording the
normaliser uses elsewhere), and whether the official normaliser (wetext 0.1.8 + the official cleanups,
`official_normalize`) already says exactly that. Where it does, cosyserve must say the same, word for word.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from cosyserve.frontend.text.normalize import normalize_report, normalize_text, official_normalize


@dataclass(frozen=True)
class Case:
    category: str
    written: str
    spoken: str
    official_right: bool
    why: str = ""  # for a case where cosyserve deliberately reads otherwise than the official: the reason


R, W = True, False  # the official reading is right / wrong

CASES = [
    # ---- money ----
    Case("money", "It costs $12.50.", "It costs twelve dollars and fifty cents.", W),
    Case("money", "It costs $12.", "It costs twelve dollars.", R),
    Case("money", "It costs $1.", "It costs one dollar.", R),
    Case("money", "It costs $0.99.", "It costs ninety nine cents.", W),
    Case("money", "It costs $1.01.", "It costs one dollar and one cent.", W),
    Case(
        "money",
        "The car costs $1,250.75.",
        "The car costs one thousand two hundred and fifty dollars and seventy five cents.",
        W,
    ),
    Case("money", "The fee is $1500.", "The fee is one thousand five hundred dollars.", W),
    Case("money", "That is €3.50.", "That is three euros and fifty cents.", W),
    Case("money", "That is €20.", "That is twenty euros.", R),
    Case("money", "A coffee is £2.40.", "A coffee is two pounds and forty pence.", W),
    Case("money", "A stamp is 75¢.", "A stamp is seventy five cents.", W),
    Case("money", "It costs ¥500.", "It costs five hundred yen.", R),
    Case("money", "They raised $1.5 million.", "They raised one point five million dollars.", R),
    Case("money", "这件衣服¥12.50。", "这件衣服十二点五元。", W),
    Case("money", "价格12.00元", "价格十二元", W),
    Case("money", "他花了$12.50", "他花了十二点五美元", W),
    Case("money", "花了100元。", "花了一百元。", R),
    Case("money", "花了12.5元。", "花了十二点五元。", R),
    Case("money", "共1,000.00元", "共一千元", W),
    Case("money", "票价$20。", "票价二十美元。", R),
    Case("money", "票价€3.5。", "票价三点五欧元。", R),
    Case("money", "票价£7.25。", "票价七点二五英镑。", R),
    # ---- thousands separators ----
    Case("thousands", "1,234 people came.", "one thousand two hundred and thirty four people came.", W),
    Case(
        "thousands",
        "The city has 12,345,678 people.",
        "The city has twelve million three hundred forty five thousand six hundred and seventy eight people.",
        R,
    ),
    Case("thousands", "We sold 10,000 copies.", "We sold ten thousand copies.", R),
    Case("thousands", "It is 1,500 km away.", "It is one thousand five hundred kilometers away.", R),
    Case("thousands", "We saw 1,000 people.", "We saw one thousand people.", W),
    Case(
        "thousands",
        "It is 1,234.5 km.",
        "It is one thousand two hundred and thirty four point five kilometers.",
        W,
    ),
    Case("thousands", "一共1,234人。", "一共一千二百三十四人。", R),
    Case("thousands", "人口12,345,678人。", "人口一千二百三十四万五千六百七十八人。", R),
    Case("thousands", "共计1,234.5元", "共计一千二百三十四点五元", R),
    # ---- decimals ----
    Case("decimals", "Pi is about 3.14.", "Pi is about three point one four.", R),
    Case("decimals", "It took 0.5 seconds.", "It took zero point five seconds.", R),
    Case("decimals", "圆周率约为3.14。", "圆周率约为三点一四。", R),
    Case("decimals", "用时0.5秒。", "用时零点五秒。", R),
    # ---- negatives ----
    Case("negatives", "It was -5 degrees.", "It was negative five degrees.", R),
    Case("negatives", "It fell to −5 degrees.", "It fell to negative five degrees.", W),
    Case(
        "negatives",
        "The loss was -1,234 dollars.",
        "The loss was negative one thousand two hundred and thirty four dollars.",
        W,
    ),
    Case("negatives", "气温-5度。", "气温负五度。", R),
    Case("negatives", "气温−5℃。", "气温负五摄氏度。", W),
    Case("negatives", "余额-12.50元。", "余额负十二点五元。", W),
    # ---- percentages ----
    Case("percentages", "Growth was 12.5%.", "Growth was twelve point five percent.", R),
    Case("percentages", "It is -3% now.", "It is negative three percent now.", R),
    Case("percentages", "增长了25%。", "增长了百分之二十五。", R),
    Case("percentages", "下降了-3%。", "下降了负百分之三。", W),
    Case("percentages", "降到-0.5%。", "降到负百分之零点五。", W),
    # ---- ranges ----
    Case("ranges", "It takes 3-5 days.", "It takes three to five days.", R),
    Case("ranges", "It takes 3–5 days.", "It takes three to five days.", W),
    Case("ranges", "Read pages 10–20.", "Read pages ten to twenty.", W),
    Case("ranges", "Up 10%-20% this year.", "Up ten to twenty percent this year.", W),
    Case("ranges", "需要3-5天。", "需要三到五天。", R),
    Case("ranges", "需要3–5天。", "需要三到五天。", W),
    Case("ranges", "需要3～5天。", "需要三到五天。", W),
    Case("ranges", "阅读第3-5章。", "阅读第三到五章。", W),
    Case("ranges", "增长了10%-20%。", "增长了百分之十到百分之二十。", W),
    Case("ranges", "比分3-2。", "比分三比二。", W),
    Case("ranges", "比分3:2。", "比分三比二。", R),
    Case("ranges", "2020–2024年", "二零二零到二零二四年", W),
    Case("zh numbers", "有1000000000000元。", "有一万亿元。", W),  # official: 一千亿零元
    Case("zh numbers", "共10000000000000人", "共十万亿人", W),
    Case("zh numbers", "达到2000000000000元", "达到两万亿元", W),
    Case("zh numbers", "共1,000,000,000,000元", "共一万亿元", W),
    Case("zh numbers", "有123456789012元", "有一千二百三十四亿五千六百七十八万九千零一十二元", R),
    Case("zh numbers", "2×3÷4等于1.5", "二乘三除以四等于一点五", W),  # official: 三除四 (4 / 3)
    Case("zh numbers", "亏损-1000000000000元", "亏损负一万亿元", W),  # the sign stays with it
    Case("zh numbers", "1000000000000-2000000000000元", "一万亿到两万亿元", W),
    # ---- powers and roots (English) ----
    Case("powers", "2^10 is large.", "two to the power of ten is large.", W),  # official: two circumflex ten
    Case("powers", "Then x^3.", "Then x cubed.", R),
    Case("powers", "Then x^2.", "Then x squared.", R),
    Case("powers", "So x² + y².", "So x squared plus y squared.", W),  # official: x²
    Case("powers", "√2 is irrational.", "the square root of two is irrational.", W),
    Case("units", "5 m² of floor", "five square meters of floor", R),  # our unit rule made it "meters²"
    # ---- names with numbers, powers, roots (`readings_zh_codes`) ----
    Case("zh names", "感染COVID-19的人", "感染COVID十九的人", W),  # official: COVID负十九
    Case("zh names", "用了GPT-4模型", "用了GPT四模型", W),
    Case("zh names", "GPT-4.5发布了", "GPT四点五发布了", W),
    Case("zh names", "歼-20战机", "歼二十战机", W),  # official: 歼负二十
    Case("zh names", "B-52轰炸机", "B五十二轰炸机", W),
    Case("zh names", "SARS-2病毒", "SARS二病毒", W),  # official: S负二阿根廷比索病毒
    Case("zh names", "RTX4090显卡", "RTX四零九零显卡", W),  # official: 四千零九十
    Case("zh names", "A320客机", "A三二零客机", W),
    Case("zh names", "若x-1等于0", "若x减一等于零", W),  # official: x负一
    Case("zh names", "iPhone 15很贵", "iPhone十五很贵", R),
    Case("zh names", "H5N1禽流感", "H五N一禽流感", R),
    Case("zh names", "气温-5度", "气温负五度", R),  # a temperature keeps its minus
    Case("zh names", "一直-5度", "一直负五度", R),  # 直 inside a word is no aircraft
    Case("zh names", "运500吨", "运五百吨", R),  # nor a joined number after 运
    Case("zh powers", "x^2加1", "x的平方加一", W),  # official: x^二加一
    Case("zh powers", "2^10等于1024", "二的十次方等于一千零二十四", W),
    Case("zh powers", "求x²的值", "求x的平方的值", W),
    Case("zh powers", "√2约等于1.414", "根号二约等于一点四一四", W),  # official: √二
    Case("zh powers", "面积是3m²", "面积是三平方米", R),  # a unit stays a unit
    Case("zh powers", "若x^2-1等于0", "若x的平方减一等于零", W),  # the sign after a power subtracts
    Case("zh powers", "解方程x^2+2x+1=0", "解方程x的平方加二x加一等于零", W),
    Case("zh powers", "3^2+4^2等于25", "三的平方加四的平方等于二十五", W),
    Case("zh names", "价格是USD100", "价格是一百美元", R),  # a currency's code is left to wetext
    Case("zh names", "共RMB500元", "共RMB五百元", R),
    Case("zh names", "Top100榜单", "Top一百榜单", R),  # a count, not a model number
    Case("zh names", "智商IQ140", "智商IQ一百四十", R),
    Case("powers", "Then x^2+y^2.", "Then x squared plus y squared.", W),  # official: x^two+y squared
    Case("powers", "So a²b.", "So a squared b.", W),
    # ---- ordinals ----
    Case("ordinals", "He came 1st.", "He came first.", R),
    Case("ordinals", "The 21st century.", "The twenty first century.", R),
    Case("ordinals", "For the 100th time.", "For the one hundredth time.", R),
    Case("ordinals", "第1名", "第一名", R),
    Case("ordinals", "第21届", "第二十一届", R),
    # ---- years and numbers ----
    Case("years", "In 2024 we won.", "In twenty twenty four we won.", R),
    Case("years", "He was born in 1999.", "He was born in nineteen ninety nine.", R),
    Case("years", "It happened in 2005.", "It happened in two thousand five.", R),
    Case("years", "2024 people came.", "two thousand and twenty four people came.", W),
    Case("years", "I have 1234 apples.", "I have one thousand two hundred and thirty four apples.", W),
    Case("years", "We printed 1000 copies.", "We printed one thousand copies.", W),
    Case("years", "We have 3000 apples.", "We have three thousand apples.", R),
    Case("years", "The 2024 elections were close.", "The twenty twenty four elections were close.", R),
    Case("years", "We met 2345 people.", "We met two thousand three hundred and forty five people.", W),
    Case("years", "Music in the 1990s.", "Music in the nineteen nineties.", W),
    Case("years", "The 2010s were busy.", "The twenty tens were busy.", W),
    Case("years", "The 2000s were busy.", "The two thousands were busy.", R),
    Case("years", "2024年", "二零二四年", R),
    Case("years", "在2024年我们赢了", "在二零二四年我们赢了", R),
    Case("years", "2024人参加", "两千零二十四人参加", R),
    Case("years", "他1999年出生", "他一九九九年出生", R),
    # ---- times ----
    Case("times", "Meet at 10:30 am.", "Meet at ten thirty AM.", R),
    Case("times", "The train leaves at 14:45.", "The train leaves at fourteen forty five.", R),
    Case("times", "It's 3:00.", "It's three o'clock.", R),
    Case("times", "现在是10:30。", "现在是十点三十分。", R),
    Case("times", "上午9:05出发", "上午九点零五分出发", R),
    # ---- dates, both orders ----
    Case("dates", "Born on 2024-03-05.", "Born on the fifth of march twenty twenty four.", R),
    Case("dates", "Due on 13/05/2024.", "Due on the thirteenth of may twenty twenty four.", R),
    Case("dates", "Due on 05/13/2024.", "Due on the thirteenth of may twenty twenty four.", R),
    Case("dates", "Born on March 5th, 2024.", "Born on the fifth of march, twenty twenty four.", R),
    Case("dates", "Born on 5 March 2024.", "Born on the fifth of march twenty twenty four.", R),
    Case("dates", "2024年3月5日", "二零二四年三月五日", R),
    Case("dates", "今天是2024-03-05", "今天是二零二四年三月五日", R),
    Case("dates", "日期13/05/2024", "日期二零二四年五月十三日", R),
    Case("dates", "日期2024.03.05", "日期二零二四年三月五日", R),
    Case("dates", "We met on 2024.03.05.", "We met on the fifth of march twenty twenty four.", R),
    # ---- phone numbers, digit by digit ----
    Case("phones", "Call 555-123-4567.", "Call five five five, one two three, four five six seven.", R),
    Case(
        "phones",
        "Call +1 555 123 4567.",
        "Call plus one, five five five, one two three, four five six seven.",
        W,
    ),
    Case("phones", "Call 13812345678.", "Call one three eight one two three four five six seven eight.", W),
    Case("phones", "电话13812345678", "电话幺三八幺二三四五六七八", R),
    Case("phones", "拨打+86 138 1234 5678", "拨打加八六，幺三八，幺二三四，五六七八", W),
    Case("phones", "拨打110", "拨打幺幺零", R),
    # ---- units ----
    Case("units", "The limit is 60 km/h.", "The limit is sixty kilometers per hour.", R),
    Case("units", "It is 25°C outside.", "It is twenty five degrees Celsius outside.", R),
    Case("units", "It weighs 5 kg.", "It weighs five kilograms.", R),
    Case("units", "It has 16 GB of memory.", "It has sixteen gigabytes of memory.", R),
    Case("units", "Run 100 m.", "Run one hundred meters.", W),
    Case("units", "It moves at 30 m/s.", "It moves at thirty meters per second.", W),
    Case("units", "Add 2 L of water.", "Add two liters of water.", W),
    Case("units", "It used 20 kWh.", "It used twenty kilowatt hours.", W),
    Case("units", "时速60km/h", "时速每小时六十公里", R),
    Case("units", "气温25°C", "气温二十五摄氏度", R),
    Case("units", "重5kg", "重五千克", R),
    Case("units", "速度30m/s", "速度每秒三十米", R),
    # ---- fractions ----
    Case("fractions", "Add 1/2 cup.", "Add one half cup.", R),
    Case("fractions", "3/4 of them agreed.", "three quarters of them agreed.", R),
    Case("fractions", "It took 2 1/2 hours.", "It took two and a half hours.", R),
    Case("fractions", "3/4的人同意", "四分之三的人同意", R),
    Case("fractions", "一半是1/2", "一半是二分之一", R),
    # ---- version numbers ----
    Case("versions", "Install version 2.3.1 now.", "Install version two point three point one now.", W),
    Case("versions", "Update to v1.2.", "Update to version one point two.", W),
    Case("versions", "Update to 2.3.1.", "Update to two point three point one.", W),
    Case("versions", "Open 192.168.0.1 now.", "Open one nine two dot one six eight dot zero dot one now.", R),
    Case("versions", "版本2.3.1", "版本二点三点一", W),
    Case("versions", "版本v1.2", "版本v一点二", R),
    # ---- web and e-mail addresses ----
    Case(
        "web",
        "Visit https://www.example.com/docs today.",
        "Visit WWW dot example dot com slash docs today.",
        W,
    ),
    Case("web", "Visit www.example.com today.", "Visit WWW dot example dot com today.", R),
    Case("web", "Email john.doe@example.com please.", "Email john dot doe at example dot com please.", R),
    Case("web", "访问www.example.com。", "访问WWW点example点com。", W),
    Case("web", "网址是https://example.com/a/b", "网址是example点com斜杠a斜杠b", W),
    Case("web", "邮箱john.doe@example.com", "邮箱john点doe at example点com", W),
    # ---- number signs ----
    Case("number signs", "Room No. 5", "Room number five", W),
    Case("number signs", "Item #5", "Item number five", W),
    # ---- runs of punctuation ----
    Case("punctuation", "你好。。。！！", "你好。", W),
    Case("punctuation", "真的吗？？？", "真的吗？", W),
    Case("punctuation", "等一下……", "等一下……", R),
    Case("punctuation", "好吧，，", "好吧。", R),
    Case("punctuation", "Hello!!!", "Hello!", W),
    Case("punctuation", "Really?!", "Really?", W),
    Case("punctuation", "Wait...", "Wait.", W),
]

# ---- Chinese: 两 or 二 (see readings_zh_two) ----
# wetext picks 两 from a list of measure words; a Chinese reader picks it by meaning: 两 counts, 二 names a
# place in an order (ordinals, the day of a date). Each case right or wrong by the official, and why.
ORDINAL = "an ordinal says 二, never 两 (第二课, 第二百名)"
DAY = "the day of a date is 二 (二月二日, as 二号)"
HOUR = "the hour of a clock time counts: 两点"
COUNT = "a count of things, times or years says 两"
ZH_TWO_CASES = [
    Case("zh ordinals", "第2课", "第二课", W, ORDINAL),
    Case("zh ordinals", "第2名", "第二名", W, ORDINAL),
    Case("zh ordinals", "第2天", "第二天", W, ORDINAL),
    Case("zh ordinals", "请翻到第2页。", "请翻到第二页。", W, ORDINAL),
    Case("zh ordinals", "第200名", "第二百名", W, ORDINAL),
    Case("zh ordinals", "第2-3课", "第二到三课", W, ORDINAL),
    Case("zh ordinals", "第 2 课", "第二课", W, ORDINAL),
    Case("zh ordinals", "第22届", "第二十二届", R),
    Case("zh ordinals", "第2章", "第二章", R),
    Case("zh ordinals", "第2次", "第二次", R),
    Case("zh ordinals", "第12课", "第十二课", R),
    Case("zh ordinals", "第2.5", "第二点五", R),
    Case("zh ordinals", "他考了第12345名。", "他考了第一万二千三百四十五名。", R),
    Case(
        "zh ordinals",
        "第12345",
        "第一万二千三百四十五",
        W,
        "an ordinal is a number, not digits (第幺二三四五)",
    ),
    Case("zh ordinals", "第20000名", "第二万名", W, ORDINAL),
    Case("zh dates", "2月2日", "二月二日", W, DAY),
    Case("zh dates", "12月2日", "十二月二日", W, DAY),
    Case("zh dates", "2024年2月2日", "二零二四年二月二日", W, DAY),
    Case("zh dates", "2月02日", "二月二日", W, DAY + "; the written 0 is not said"),
    Case("zh dates", "3月2号", "三月二号", R),
    Case("zh dates", "2月22日", "二月二十二日", R),
    Case("zh dates", "2月", "二月", R),
    Case("zh clock", "下午2:30", "下午两点三十分", R),
    Case("zh clock", "现在是2:05。", "现在是两点零五分。", R),
    Case("zh clock", "下午2点", "下午两点", W, HOUR),
    Case("zh clock", "2点半", "两点半", W, HOUR),
    Case("zh clock", "2点30分出发", "两点三十分出发", W, HOUR),
    Case("zh clock", "下午2点到3点", "下午两点到三点", W, HOUR),
    Case("zh clock", "12点整", "十二点整", R),
    Case("zh clock", "晚上22:00", "晚上二十二点", R),
    Case("zh multiples", "是原来的2倍", "是原来的两倍", W, COUNT),
    Case("zh multiples", "增长了12倍", "增长了十二倍", R),
    Case("zh multiples", "2.5倍", "二点五倍", R),
    Case("zh measure words", "2个", "两个", R),
    Case("zh measure words", "2本书", "两本书", R),
    Case("zh measure words", "12个", "十二个", R),
    Case("zh measure words", "20个", "二十个", R),
    Case("zh measure words", "22个", "二十二个", R),
    Case("zh measure words", "2000元", "两千元", R),
    Case("zh measure words", "200万", "两百万", R),
    Case("zh measure words", "去过2次", "去过两次", W, COUNT),
    Case("zh measure words", "读2遍", "读两遍", W, COUNT),
    Case("zh measure words", "买了2台电脑", "买了两台电脑", W, COUNT),
    Case("zh measure words", "学过2门课", "学过两门课", W, COUNT),
    Case("zh measure words", "近2年", "近两年", W, COUNT),
    Case("zh measure words", "每天1-2次", "每天一到两次", W, COUNT + "; 1-2 is a range, not 1 minus 2"),
    Case("zh measure words", "读2-3遍", "读两到三遍", W, COUNT + "; 2-3 is a range, not 2 minus 3"),
    Case("zh measure words", "需要3~5次", "需要三到五次", R),
    Case("zh measure words", "1-2个", "一到两个", R),
    Case("zh measure words", "2年前", "两年前", R),
    Case("zh measure words", "2年级", "二年级", R),
    Case("zh measure words", "公元2年", "公元二年", R),
    Case("zh measure words", "2次方", "二次方", R),
    Case("zh measure words", "2号楼", "二号楼", R),
    Case("zh measure words", "2两", "二两", R),
    Case("zh untouched", "用时2.2秒", "用时二点二秒", R),
    Case("zh untouched", "电话12345678902", "电话幺二三四五六七八九零二", R),
    Case("zh untouched", "拨打+86 138 2222 2222", "拨打加八六，幺三八，二二二二，二二二二", W),
]
CASES += ZH_TWO_CASES

CATEGORIES = {
    *("money", "thousands", "decimals", "negatives", "percentages", "ranges", "ordinals", "years", "times"),
    *("dates", "phones", "units", "fractions", "versions", "web", "punctuation"),
}


def _id(case: Case) -> str:
    return f"{case.category}:{case.written}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_cosyserve_reads_it_as_a_native_speaker(case: Case) -> None:
    assert normalize_text(case.written) == case.spoken


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_official_marking_is_true(case: Case) -> None:
    """Right cases: the official says exactly this (so cosyserve says what the official says)."""
    assert (official_normalize(case.written) == case.spoken) == case.official_right


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_corrections_are_reported_only_where_the_official_is_wrong(case: Case) -> None:
    report = normalize_report(case.written, with_official=True)
    assert report.spoken == case.spoken
    assert bool(report.corrections) == (not case.official_right)


def test_the_table_covers_both_languages_and_every_category() -> None:
    assert len(CASES) >= 80
    assert {case.category for case in CASES} >= CATEGORIES
    chinese = sum(any("\u4e00" <= char <= "\u9fff" for char in case.written) for case in CASES)
    assert 30 <= chinese <= len(CASES) - 30
    assert len({case.written for case in CASES}) == len(CASES)
    wrong = sum(not case.official_right for case in CASES)
    assert wrong >= 40  # what the table is for


def test_the_chinese_two_section_says_why_it_differs() -> None:
    categories = {case.category for case in ZH_TWO_CASES}
    names = ("ordinals", "dates", "clock", "multiples", "measure words", "untouched")
    assert categories == {f"zh {name}" for name in names}
    for case in ZH_TWO_CASES:
        if case.category != "zh untouched":
            assert bool(case.why) == (not case.official_right), case


def test_normalize_command_reads_an_ordinal_with_er(
    tiny_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cosyserve.cli import main

    assert main(["normalize", "--model", str(tiny_dir / "model"), "第2课"]) == 0
    out = capsys.readouterr().out
    assert "spoken       第二课" in out
    assert "official     第两课" in out
    assert "ordinal read with 二: 第2 -> 第二" in out
