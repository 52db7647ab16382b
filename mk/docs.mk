# mk/docs.mk - `make test-docs` (part of `make test`): checks that every relative link
# and every repository path in backticks in README.md and docs/*.md exists
# (tests/docs/check_docs.py states the rule), after a self-test of the checker.

# Included before the top Makefile's first rule: keep `all` the default goal
# (restored at the end of the file).
_docs_mk_goal := $(.DEFAULT_GOAL)

DOCS_PYTHON ?= python3

.PHONY: test-docs

test-docs:
	$(DOCS_PYTHON) tests/docs/test_check_docs.py
	$(DOCS_PYTHON) tests/docs/check_docs.py

EXTRA_TESTS += test-docs

.DEFAULT_GOAL := $(_docs_mk_goal)
