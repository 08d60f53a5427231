# Entry points; see README. Each target is self-contained on a fresh machine:
# scripts/setup installs toolchains (`scripts/setup test` also what only the
# tests use), scripts/pg-test-server provides PostgreSQL.
.PHONY: run test lint plugins book

# The main job: build everything, serve on SQLite with the example
# deployers, the publishing target demo (./data/published/) and a
# registered sample model, published once (scripts/demo prints where).
run:
	scripts/demo

# The book's build and link check, then the host tests (guest crates are
# not default workspace members). The test
# database URL comes from scripts/pg-test-server (or BERTH_TEST_DATABASE_URL).
test:
	scripts/setup test
	$(MAKE) book
	scripts/build-plugins
	url="$$(scripts/pg-test-server)" && BERTH_TEST_DATABASE_URL="$$url" cargo test

lint: book
	scripts/setup
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings

# The book (docs/src) rendered into docs/book; fails on a broken internal
# link or anchor, which mdBook itself does not check.
book:
	scripts/setup book
	target/tools/bin/mdbook build docs
	scripts/check-book-links docs/book

plugins:
	scripts/setup
	scripts/build-plugins
