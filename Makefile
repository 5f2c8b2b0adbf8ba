# The two commands of the README:
#   cargo run --release --bin tidings -- serve   # the whole system locally, embedded backend
#   make test                                    # everything, against a local AWS emulator
.PHONY: test serve lint book

test:
	bash infra/test.sh

serve:
	cargo run --release --bin tidings -- serve --dev

lint:
	bash infra/lint.sh

# The book (docs/, mdBook) in target/book; mdBook is installed once into infra/.tools.
book:
	bash infra/book.sh
