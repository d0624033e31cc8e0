"""Writes dsh_session.json: a DeepSeek-Harness-style agent session for the prefix-cache agent-trace test
(tests/engine/agent_trace_test.cpp). The shapes follow ../shared/spec/serving.md §4b: a long system prompt,
function tools, assistant turns with reasoning_content and tool_calls (content "" on tool-only turns), tool
results (with "(no output)" for empty output), and user follow-ups mid-session. Request k of the session is
`messages` up to (not including) the k-th assistant message, sent with the same tools, thinking enabled.

Run: .venv/bin/python tests/data/agent_trace/make_dsh_session.py (deterministic; no randomness)."""
import json
import os

SYSTEM = """You are DSH, the DeepSeek Harness coding agent. You operate inside the user's workspace with the tools listed below and you follow the workspace sandbox policy (workspace-write): you may read anything in the workspace, write files in it, and run commands that do not need network access.

# How you work
- Understand the task before changing anything: read the relevant files, search for the symbols involved, and look at the tests that cover them.
- Keep a short todo list with the todo_write tool for any task with more than two steps, and update it as you go (exactly one item in_progress at a time).
- Make the smallest change that solves the task. Match the surrounding code style: naming, error handling, comments, formatting.
- After editing, run the project's formatter and the tests that cover your change. Fix what you broke before you report.
- Never invent file contents: read a file before editing it, and quote exact text in edit_file's old_string.
- When a command fails, read its output carefully; do not retry the same command unchanged.

# Tool use
- Prefer grep and glob over running find or ls through bash.
- Batch independent reads into one turn when you can.
- bash commands run in the workspace root with a 120 s timeout; long-running servers must be started in the background and stopped afterwards.
- Paths are relative to the workspace root.

# Reporting
When you are done, reply with a short summary: what you changed (files), how you verified it (commands and results), and anything left for the user to decide. Do not paste whole files.

# Environment
- Workspace: /home/dev/projects/ledger (a Python 3.11 package with a command-line interface)
- Platform: linux, shell bash
- Date: 2026-10-03
"""


def tool(name, description, properties, required):
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": properties,
                                                            "required": required}}}


TOOLS = [
    tool("read_file", "Read a text file from the workspace. Returns numbered lines; use offset and limit for large files.",
         {"path": {"type": "string", "description": "File path relative to the workspace root"},
          "offset": {"type": "integer", "description": "First line to read (1-based)"},
          "limit": {"type": "integer", "description": "Maximum number of lines to return"}}, ["path"]),
    tool("write_file", "Create or overwrite a file with the given content.",
         {"path": {"type": "string", "description": "File path relative to the workspace root"},
          "content": {"type": "string", "description": "The complete new file content"}}, ["path", "content"]),
    tool("edit_file", "Replace an exact string in a file. old_string must occur exactly once unless replace_all is true.",
         {"path": {"type": "string"}, "old_string": {"type": "string", "description": "Exact text to replace"},
          "new_string": {"type": "string", "description": "Replacement text"},
          "replace_all": {"type": "boolean", "description": "Replace every occurrence"}},
         ["path", "old_string", "new_string"]),
    tool("bash", "Run a shell command in the workspace root and return its exit code, stdout and stderr.",
         {"command": {"type": "string", "description": "The command line"},
          "timeout_ms": {"type": "integer", "description": "Timeout in milliseconds (default 120000)"}}, ["command"]),
    tool("grep", "Search file contents with a regular expression (ripgrep syntax).",
         {"pattern": {"type": "string"}, "path": {"type": "string", "description": "Directory or file to search"},
          "glob": {"type": "string", "description": "Only files matching this glob"},
          "context": {"type": "integer", "description": "Lines of context around each match"}}, ["pattern"]),
    tool("glob", "List files matching a glob pattern, newest first.",
         {"pattern": {"type": "string", "description": "e.g. src/**/*.py"}}, ["pattern"]),
    tool("todo_write", "Replace the session's todo list.",
         {"todos": {"type": "array", "items": {"type": "object", "properties": {
             "content": {"type": "string"},
             "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}},
             "required": ["content", "status"]}}}, ["todos"]),
    tool("web_fetch", "Fetch a URL and return its text (disabled in offline sessions).",
         {"url": {"type": "string"}, "prompt": {"type": "string", "description": "What to extract"}}, ["url"]),
]

messages = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "The `ledger stats` command prints a table. Add a `--json` flag that prints the same numbers as a JSON object instead, with a test. Keep the table output unchanged."}]

call_no = [0]


def assistant(reasoning, calls=None, content=""):
    msg = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if calls:
        msg["tool_calls"] = []
        for name, args in calls:
            call_no[0] += 1
            msg["tool_calls"].append({"id": "call_%02d_%s" % (call_no[0], name), "type": "function",
                                      "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
    messages.append(msg)
    return msg


def results(*outputs):
    calls = messages[-1]["tool_calls"]
    assert len(calls) == len(outputs)
    for call, out in zip(calls, outputs):
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": out if out else "(no output)"})


def todos(*items):
    return {"todos": [{"content": c, "status": s} for c, s in items]}


assistant("The user wants a --json flag on `ledger stats`. Several steps: find the command, understand how the table is built, add the flag, write a test, run tests. I'll start a todo list.",
          [("todo_write", todos(("Find the stats command implementation", "in_progress"), ("Add --json output", "pending"),
                                ("Add a test for --json", "pending"), ("Run formatter and tests", "pending")))])
results("Todo list updated (4 items).")
assistant("Now locate the CLI code. A glob over the package should show the layout.", [("glob", {"pattern": "ledger/**/*.py"})])
results("ledger/__init__.py\nledger/cli.py\nledger/stats.py\nledger/store.py\nledger/format.py\nledger/models.py")
assistant("cli.py likely defines the subcommands and stats.py computes the numbers. Let me search for the stats subcommand registration.",
          [("grep", {"pattern": "def cmd_stats|add_parser\\(\"stats\"", "path": "ledger", "context": 3})])
results("ledger/cli.py-41-\nledger/cli.py:42:    p = sub.add_parser(\"stats\", help=\"summary of the ledger\")\nledger/cli.py-43-    p.add_argument(\"--since\", help=\"only entries on or after DATE\")\nledger/cli.py-44-    p.set_defaults(func=cmd_stats)\n--\nledger/cli.py:88:def cmd_stats(args):\nledger/cli.py-89-    store = Store.open(args.ledger)\nledger/cli.py-90-    summary = compute_summary(store, since=args.since)\nledger/cli.py-91-    print(render_table(summary))")
assistant("cmd_stats calls compute_summary and render_table. I should read compute_summary to see what the summary object looks like, and format.py for render_table. Two independent reads.",
          [("read_file", {"path": "ledger/stats.py"}), ("read_file", {"path": "ledger/format.py"})])
results("     1\tfrom dataclasses import dataclass\n     2\tfrom datetime import date\n     3\t\n     4\t\n     5\t@dataclass\n     6\tclass Summary:\n     7\t    entries: int\n     8\t    total_in: int  # cents\n     9\t    total_out: int  # cents\n    10\t    first: date | None\n    11\t    last: date | None\n    12\t    by_category: dict[str, int]\n    13\t\n    14\t\n    15\tdef compute_summary(store, since=None):\n    16\t    rows = store.entries(since=since)\n    17\t    by_cat = {}\n    18\t    for r in rows:\n    19\t        by_cat[r.category] = by_cat.get(r.category, 0) + r.amount\n    20\t    return Summary(len(rows), sum(r.amount for r in rows if r.amount > 0),\n    21\t                   -sum(r.amount for r in rows if r.amount < 0),\n    22\t                   min((r.day for r in rows), default=None), max((r.day for r in rows), default=None), by_cat)",
        "     1\tdef cents(v):\n     2\t    sign = \"-\" if v < 0 else \"\"\n     3\t    v = abs(v)\n     4\t    return f\"{sign}{v // 100}.{v % 100:02d}\"\n     5\t\n     6\t\n     7\tdef render_table(s):\n     8\t    lines = [f\"entries    {s.entries}\", f\"income     {cents(s.total_in)}\", f\"expenses   {cents(s.total_out)}\"]\n     9\t    if s.first:\n    10\t        lines.append(f\"period     {s.first} .. {s.last}\")\n    11\t    for cat, v in sorted(s.by_category.items()):\n    12\t        lines.append(f\"  {cat:<12} {cents(v)}\")\n    13\t    return \"\\n\".join(lines)")
assistant("Summary is a dataclass with ints in cents, dates and a dict. For JSON I'll keep cents as integers (exact, no float rounding) and dates as ISO strings. I'll add render_json in format.py next to render_table. Update the todo list first.",
          [("todo_write", todos(("Find the stats command implementation", "completed"), ("Add --json output", "in_progress"),
                                ("Add a test for --json", "pending"), ("Run formatter and tests", "pending")))])
results("Todo list updated (4 items).")
assistant("Add render_json to format.py. json.dumps with sort_keys for stable output; dates via isoformat; None stays null.",
          [("edit_file", {"path": "ledger/format.py", "old_string": "def render_table(s):",
                          "new_string": "def render_json(s):\n    return json.dumps({\n        \"entries\": s.entries,\n        \"income_cents\": s.total_in,\n        \"expenses_cents\": s.total_out,\n        \"first\": s.first.isoformat() if s.first else None,\n        \"last\": s.last.isoformat() if s.last else None,\n        \"by_category_cents\": dict(sorted(s.by_category.items())),\n    }, sort_keys=True)\n\n\ndef render_table(s):"})])
results("Edited ledger/format.py (1 replacement).")
assistant("format.py needs `import json` at the top; the file had no imports. Insert it before `def cents`.",
          [("edit_file", {"path": "ledger/format.py", "old_string": "def cents(v):", "new_string": "import json\n\n\ndef cents(v):"})])
results("Edited ledger/format.py (1 replacement).")
assistant("Now the CLI: add the --json argument to the stats parser and branch in cmd_stats. I need the import line of cli.py to add render_json; read the top of the file.",
          [("read_file", {"path": "ledger/cli.py", "offset": 1, "limit": 20})])
results("     1\timport argparse\n     2\timport sys\n     3\t\n     4\tfrom .format import render_table\n     5\tfrom .stats import compute_summary\n     6\tfrom .store import Store\n     7\t\n     8\t\n     9\tdef build_parser():\n    10\t    parser = argparse.ArgumentParser(prog=\"ledger\")\n    11\t    parser.add_argument(\"--ledger\", default=\"ledger.db\")\n    12\t    sub = parser.add_subparsers(dest=\"command\", required=True)")
assistant("Three edits in cli.py: the import, the argument, and the output branch. They touch different lines so I can do them one after another in one turn.",
          [("edit_file", {"path": "ledger/cli.py", "old_string": "from .format import render_table", "new_string": "from .format import render_json, render_table"}),
           ("edit_file", {"path": "ledger/cli.py", "old_string": "    p.add_argument(\"--since\", help=\"only entries on or after DATE\")",
                          "new_string": "    p.add_argument(\"--since\", help=\"only entries on or after DATE\")\n    p.add_argument(\"--json\", action=\"store_true\", help=\"print the summary as a JSON object\")"}),
           ("edit_file", {"path": "ledger/cli.py", "old_string": "    print(render_table(summary))",
                          "new_string": "    print(render_json(summary) if args.json else render_table(summary))"})])
results("Edited ledger/cli.py (1 replacement).", "Edited ledger/cli.py (1 replacement).", "Edited ledger/cli.py (1 replacement).")
assistant("Quick manual check before writing the test: is there a sample ledger? Look for fixtures used by the tests.",
          [("glob", {"pattern": "tests/**/*"})])
results("tests/conftest.py\ntests/test_cli.py\ntests/test_stats.py\ntests/data/sample.csv")
assistant("conftest probably builds a store from sample.csv. Read conftest.py and the existing CLI test to follow their style.",
          [("read_file", {"path": "tests/conftest.py"}), ("read_file", {"path": "tests/test_cli.py"})])
results("     1\timport pytest\n     2\t\n     3\tfrom ledger.store import Store\n     4\t\n     5\t\n     6\t@pytest.fixture\n     7\tdef sample_ledger(tmp_path):\n     8\t    db = tmp_path / \"ledger.db\"\n     9\t    Store.import_csv(db, \"tests/data/sample.csv\")\n    10\t    return db",
        "     1\tfrom ledger.cli import main\n     2\t\n     3\t\n     4\tdef test_stats_table(sample_ledger, capsys):\n     5\t    main([\"--ledger\", str(sample_ledger), \"stats\"])\n     6\t    out = capsys.readouterr().out\n     7\t    assert out.splitlines()[0] == \"entries    6\"\n     8\t    assert \"income     1250.00\" in out")
assistant("The table test shows 6 entries and income 1250.00 = 125000 cents. My JSON test can check the same numbers independently of the table, parsing the JSON. Mark the todo and write the test.",
          [("todo_write", todos(("Find the stats command implementation", "completed"), ("Add --json output", "completed"),
                                ("Add a test for --json", "in_progress"), ("Run formatter and tests", "pending")))])
results("Todo list updated (4 items).")
assistant("Append the test to tests/test_cli.py. It parses stdout as JSON and checks entries, income and that the by-category sums add up to income minus expenses.",
          [("edit_file", {"path": "tests/test_cli.py", "old_string": "    assert \"income     1250.00\" in out",
                          "new_string": "    assert \"income     1250.00\" in out\n\n\ndef test_stats_json(sample_ledger, capsys):\n    main([\"--ledger\", str(sample_ledger), \"stats\", \"--json\"])\n    data = json.loads(capsys.readouterr().out)\n    assert data[\"entries\"] == 6\n    assert data[\"income_cents\"] == 125000\n    assert sum(data[\"by_category_cents\"].values()) == data[\"income_cents\"] - data[\"expenses_cents\"]"}),
           ("edit_file", {"path": "tests/test_cli.py", "old_string": "from ledger.cli import main", "new_string": "import json\n\nfrom ledger.cli import main"})])
results("Edited tests/test_cli.py (1 replacement).", "Edited tests/test_cli.py (1 replacement).")
assistant("Run the CLI tests.", [("bash", {"command": "python -m pytest -q tests/test_cli.py"})])
results("exit code 1\n.F                                                                       [100%]\n=================================== FAILURES ===================================\n_______________________________ test_stats_json ________________________________\n    data = json.loads(capsys.readouterr().out)\n>   assert data[\"entries\"] == 6\nE   KeyError: 'entries'\n\nE   json.decoder.JSONDecodeError? no: data = {'by_category_cents': ..., 'entries ': 6}\n1 failed, 1 passed in 0.21s")
assistant("The key came out as 'entries ' with a trailing space? That cannot come from my dict literal... Let me look at the file as it is now rather than guess.",
          [("read_file", {"path": "ledger/format.py"})])
results("     1\timport json\n     2\t\n     3\t\n     4\tdef cents(v):\n     5\t    sign = \"-\" if v < 0 else \"\"\n     6\t    v = abs(v)\n     7\t    return f\"{sign}{v // 100}.{v % 100:02d}\"\n     8\t\n     9\t\n    10\tdef render_json(s):\n    11\t    return json.dumps({\n    12\t        \"entries \": s.entries,\n    13\t        \"income_cents\": s.total_in,")
assistant("There is a stray space in the key on line 12 (my edit must have carried it). Fix it.",
          [("edit_file", {"path": "ledger/format.py", "old_string": "        \"entries \": s.entries,", "new_string": "        \"entries\": s.entries,"})])
results("Edited ledger/format.py (1 replacement).")
assistant("Re-run the CLI tests.", [("bash", {"command": "python -m pytest -q tests/test_cli.py"})])
results("exit code 0\n..                                                                       [100%]\n2 passed in 0.19s")
messages.append({"role": "user", "content": "Nice. Please also mention the flag in the README's usage section, and make sure `--json` works together with `--since`."})
assistant("Two things: README usage, and --since with --json. --since is applied in compute_summary before rendering, so it should compose; I'll add a test to prove it. First find the README usage section.",
          [("grep", {"pattern": "ledger stats", "path": "README.md", "context": 2}),
           ("todo_write", todos(("Find the stats command implementation", "completed"), ("Add --json output", "completed"),
                                ("Add a test for --json", "completed"), ("Run formatter and tests", "pending"),
                                ("Document --json in README", "in_progress"), ("Test --json with --since", "pending")))])
results("README.md-30-## Usage\nREADME.md-31-\nREADME.md:32:    ledger stats [--since DATE]     summary table of income, expenses and categories\nREADME.md-33-    ledger add AMOUNT CATEGORY      add an entry", "Todo list updated (6 items).")
assistant("Update the usage line to list --json.",
          [("edit_file", {"path": "README.md", "old_string": "    ledger stats [--since DATE]     summary table of income, expenses and categories",
                          "new_string": "    ledger stats [--since DATE] [--json]\n                                    summary of income, expenses and categories (a table,\n                                    or a JSON object with amounts in cents)"})])
results("Edited README.md (1 replacement).")
assistant("For the --since test I need a date that splits sample.csv. Read the sample data.", [("read_file", {"path": "tests/data/sample.csv"})])
results("     1\tday,amount,category\n     2\t2026-01-03,50000,salary\n     3\t2026-01-05,-1200,food\n     4\t2026-01-20,-30000,rent\n     5\t2026-02-03,75000,salary\n     6\t2026-02-07,-2500,food\n     7\t2026-02-21,-900,transport")
assistant("Since 2026-02-01 leaves the last three rows: 75000 income, 3400 expenses, first 2026-02-03. Add that test.",
          [("edit_file", {"path": "tests/test_cli.py", "old_string": "    assert sum(data[\"by_category_cents\"].values()) == data[\"income_cents\"] - data[\"expenses_cents\"]",
                          "new_string": "    assert sum(data[\"by_category_cents\"].values()) == data[\"income_cents\"] - data[\"expenses_cents\"]\n\n\ndef test_stats_json_since(sample_ledger, capsys):\n    main([\"--ledger\", str(sample_ledger), \"stats\", \"--since\", \"2026-02-01\", \"--json\"])\n    data = json.loads(capsys.readouterr().out)\n    assert (data[\"entries\"], data[\"income_cents\"], data[\"expenses_cents\"]) == (3, 75000, 3400)\n    assert data[\"first\"] == \"2026-02-03\""})])
results("Edited tests/test_cli.py (1 replacement).")
assistant("Run the formatter the project uses. Check pyproject for the formatter config first? The repo likely uses ruff; just run it on the changed files.",
          [("bash", {"command": "ruff format ledger/format.py ledger/cli.py tests/test_cli.py && ruff check ledger tests"})])
results("3 files left unchanged\nAll checks passed!")
assistant("Run the whole test suite now.", [("bash", {"command": "python -m pytest -q"})])
results("exit code 0\n.......                                                                  [100%]\n7 passed in 0.34s")
assistant("All pass. A last manual run of both outputs to see them as a user would.",
          [("bash", {"command": "python -m ledger.cli --ledger /tmp/l.db stats --json 2>&1 | head -c 300; echo; python -m pytest -q tests/test_cli.py -k since"})])
results("")
assistant("The manual run printed nothing: /tmp/l.db does not exist and the error went to a pipe that head cut. Not a problem with the change; the tests cover the behaviour. Close the todo list.",
          [("todo_write", todos(("Find the stats command implementation", "completed"), ("Add --json output", "completed"),
                                ("Add a test for --json", "completed"), ("Run formatter and tests", "completed"),
                                ("Document --json in README", "completed"), ("Test --json with --since", "completed")))])
results("Todo list updated (6 items).")
assistant("Everything is done; write the summary.", None,
          "Added `ledger stats --json`.\n\n- `ledger/format.py`: `render_json(summary)` prints the summary as a JSON object (amounts in integer cents, dates as ISO strings, categories sorted).\n- `ledger/cli.py`: the `--json` flag; the table output is unchanged.\n- `tests/test_cli.py`: `test_stats_json` and `test_stats_json_since` (the flag composes with `--since`).\n- `README.md`: usage line.\n\nVerified with `ruff format`/`ruff check` and `python -m pytest -q` (7 passed).")

session = {"model": "deepseek-v4.1-flash", "thinking": {"type": "enabled"}, "reasoning_effort": "high",
           "max_tokens": 256000, "stream": True, "stream_options": {"include_usage": True}, "tools": TOOLS,
           "messages": messages}
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dsh_session.json")
with open(out, "w", encoding="utf-8") as f:
    json.dump(session, f, indent=1, ensure_ascii=False)
    f.write("\n")
n_assistant = sum(1 for m in messages if m["role"] == "assistant")
print(f"{out}: {len(messages)} messages, {n_assistant} assistant turns")
