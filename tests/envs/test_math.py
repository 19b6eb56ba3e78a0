"""Competition math env: answer equivalence over real answer styles, the sets' layouts, episodes."""

import json

import pytest

import grl.envs
from grl.envs.math import MathEnv
from grl.envs.math_grading import grade, last_boxed

# (gold as the set writes it, a model's answer, equal?) in the styles of MATH-500, AIME, AMC and Minerva.
EQUIVALENCE = [
    ("\\frac{3}{4}", "0.75", True),
    ("\\frac{3}{4}", "3/4", True),
    ("\\dfrac{9}{7}", "\\frac{9}{7}", True),
    ("12", "\\boxed{12}", True),
    ("12", "$12$", True),
    ("2\\sqrt{3}", "\\sqrt{12}", True),
    ("11\\sqrt2", "11\\sqrt{2}", True),
    ("\\frac{\\sqrt{3}}{2}", "\\sqrt{3}/2", True),
    ("(-\\infty, 2]", "(-\\infty,2]", True),
    ("(-\\infty, 2]", "(-\\infty,2)", False),
    ("(-\\infty,-2)\\cup(2,\\infty)", "(-\\infty, -2) \\cup (2, \\infty)", True),
    ("[1,2]", "[1, 2)", False),
    ("30^\\circ", "30", True),
    ("90^\\circ", "90 degrees", True),
    ("90^\\circ", "\\boxed{90^{\\circ}}", True),
    ("1000", "1,000", True),
    ("\\$32,348", "32348", True),
    ("1{,}000", "1000", True),
    ("10\\%", "10", True),
    ("204", "The answer is 204.", True),
    ("204", "So the final answer is $\\boxed{204}$.", True),
    ("12", "12 apples", True),
    ("12", "12 or 13", False),
    ("033", "33", True),
    ("113", "131", False),
    ("\\text{(C)}", "C", True),
    ("\\text{(C)}", "(C)", True),
    ("\\text{(C)}", "D", False),
    ("\\text{Evelyn}", "Evelyn", True),
    ("\\text{Evelyn}", "Evlyne", False),
    ("\\text{east}", "West", False),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)", True),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi)", False),
    ("6 - 5i", "6-5i", True),
    ("x^2+7x+10", "(x+2)(x+5)", True),
    ("3, 5", "5, 3", True),
    ("3, 5", "3", False),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True),
    ("4.5 \\times 10^{-7}", "4.5e-7", True),
    ("7.5\\times10^{-7}", "7.6\\times 10^{-7}", False),
    ("y = 2x+3", "2x+3", True),
    ("\\frac{1}{2}", "\\frac{1}{3}", False),
    ("5", "5.0", True),
    ("27", "27.0", True),
    ("p - q", "p-q", True),
    ("\\pi", "3.14159", False),
    ("\\frac{1}{6}", "0.17", False),
    ("5\\text{ cm}", "5", True),
    ("0.5", "1/2", True),
    ("2", "x=2", True),
    ("-4", "4", False),
]


@pytest.mark.parametrize("gold, answer, equal", EQUIVALENCE)
def test_answer_equivalence(gold, answer, equal):
    assert grade(gold, answer).correct is equal


def test_a_runaway_answer_is_wrong_and_graded_in_time():
    verdict = grade("5", "\\boxed{100000000!}", 3.0)
    assert verdict.correct is False


def test_last_boxed():
    assert last_boxed("so \\boxed{1} and \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert last_boxed("no box") is None and last_boxed("\\boxed{unclosed") is None


# The sets' own layouts (a few real-style rows each), as the hub serves them and as the installer writes them.
LAYOUTS = {
    "math500": [
        {
            "problem": "Compute $\\dbinom{8}{4}$.",
            "solution": "... $\\boxed{70}$.",
            "answer": "70",
            "subject": "Counting & Probability",
            "level": 2,
            "unique_id": "test/counting_and_probability/1.json",
        },
        {
            "problem": "Solve $x^2 < 4$.",
            "solution": "...",
            "answer": "(-2,2)",
            "subject": "Algebra",
            "level": 3,
            "unique_id": "test/algebra/2.json",
        },
    ],
    "aime24": [
        {
            "id": 60,
            "problem": "Find the remainder ...",
            "solution": "Hence the answer is \\boxed{204}.",
            "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_1",
        }
    ],
    "aime25": [{"problem": "Find the sum of all integer bases ...", "answer": "70", "id": "0"}],
    "amc23": [{"id": 0, "question": "How many positive perfect squares ...", "answer": 12.0, "url": "..."}],
    "minervamath": [
        {"question": "Compute the wavelength in meters ...", "answer": "4.5e-7", "type": "Physics"}
    ],
}


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("math")
    for name, rows in LAYOUTS.items():
        (root / name).mkdir()
        (root / name / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return root


@pytest.mark.parametrize(
    "name, gold_reply",
    [
        ("math500", "70"),
        ("aime24", "204"),
        ("aime25", "70"),
        ("amc23", "12"),
        ("minervamath", "4.5 \\times 10^{-7}"),
    ],
)
def test_every_layout_loads_and_grades(sets, name, gold_reply):
    env = grl.envs.make("math", data_path=str(sets / name / "{split}.jsonl"))
    problem = env.reset(0)
    assert problem == (LAYOUTS[name][0].get("problem") or LAYOUTS[name][0]["question"])
    obs, reward, done, info = env.step(gold_reply)
    assert (reward, done, info["success"], obs) == (10.0, True, True, "Correct.")
    assert env.valid_actions() is None  # free text


def test_multi_turn_retries_within_the_budget_and_sums_rewards(sets):
    env = MathEnv(data_path=str(sets / "math500" / "test.jsonl"), max_attempts=3)
    question = env.reset(1)
    obs, reward, done, info = env.step("(-2, 2]")
    assert (reward, done, info["success"]) == (-0.1, False, False)
    assert "is not the right answer" in obs and "Try again" in obs and question in obs
    obs, reward, done, info = env.step("   ")
    assert (reward, done, info["action_is_valid"]) == (-0.1, False, False) and "No answer" in obs
    obs, reward, done, info = env.step("$(-2,2)$")
    assert (reward, done, info["success"], info["attempts"]) == (10.0, True, True, 3)
    assert env.step("(-2,2)")[1:3] == (0.0, True)  # over: no late reward


def test_attempts_run_out(sets):
    env = MathEnv(data_path=str(sets / "aime24" / "test.jsonl"), max_attempts=2)
    env.reset(5)
    assert env.step("1")[2] is False
    obs, reward, done, info = env.step("2")
    assert (reward, done, info["success"]) == (-0.1, True, False) and "Try again" not in obs


def test_missing_file_is_one_line_naming_path_and_install_command(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        MathEnv(data_path=str(tmp_path / "math" / "aime24" / "{split}.jsonl"))
    message = str(err.value)
    assert "math/aime24/test.jsonl" in message and "scripts/install_dataset.sh --math" in message
    assert "\n" not in message


def test_rows_without_an_answer_are_refused(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "p", "solution": "no box"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        MathEnv(data_path=str(bad))


def test_grading_from_many_threads_agrees_with_the_table():
    # Envs step in a thread pool; math-verify's own timeout would refuse to run there.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:  # a timeout of 9 s is a new cache key: every case is graded again
        verdicts = list(pool.map(lambda case: grade(case[0], case[1], 9.0).correct, EQUIVALENCE))
    assert verdicts == [equal for _, _, equal in EQUIVALENCE]
