# mk/docs.mk - `make test-docs` (part of `make test`): checks that every relative link
# and every repository path in backticks in README.md and docs/*.md exists
# (tests/docs/check_docs.py states the rule), after a self-test of the checker.

DOCS_PYTHON ?= python3

.PHONY: test-docs

test-docs:
	$(call stage_begin,test-docs)
	$(DOCS_PYTHON) tests/docs/test_check_docs.py
	$(DOCS_PYTHON) tests/docs/check_docs.py
	$(call stage_end,test-docs)

EXTRA_TESTS += test-docs
