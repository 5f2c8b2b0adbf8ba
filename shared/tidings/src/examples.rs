//! The examples every command's `--help` ends with. Each line that runs `tidings` is parsed by a
//! test against the command line it documents (`tests::every_command_has_examples_that_parse`),
//! so an example cannot go stale.

pub const TIDINGS: &str = "\
Examples:
  # Run everything locally; the data stays in ./.tidings
  tidings serve
  # From the same directory, while it runs: make a key, read the dead letters
  tidings keys create --role tenant --tenant acme --name checkout
  tidings ops dlq list
  # The configuration in effect, and where each value comes from
  tidings config
  # A campaign to 10,000 recipients on a fresh database
  tidings bench campaign --recipients 10000 --no-peer

Every command but serve and bench works on the store `tidings serve` keeps in --data-dir
(default ./.tidings, relative to where it runs) and never makes a new one: run it where serve
runs, or pass the --data-dir serve prints. A command that prints JSON prints only that on
stdout; progress, summaries and logs go to stderr.";

pub const SERVE: &str = "\
Examples:
  # The embedded backend in ./.tidings, on 127.0.0.1:8080
  tidings serve
  # Another data directory and port; /dev routes without a key on loopback
  tidings serve --data-dir /var/lib/tidings --addr 127.0.0.1:9090 --dev
  # Time moves only when POST /dev/clock/advance says so
  tidings serve --dev --manual-clock
  # Emulators on this machine (a build with --features aws): tables and queues made first
  AWS_ENDPOINT_URL=http://127.0.0.1:4566 tidings serve --backend aws --bootstrap --dev";

pub const BENCH: &str = "\
Examples:
  tidings bench campaign --recipients 100000
  tidings bench reserve --orders 20000 --units 10000 --concurrency 32
  tidings bench digest --users 10000 --per-user 10

The benches make their own stores and log warnings only unless TIDINGS_LOG is set.";

pub const BENCH_CAMPAIGN: &str = "\
Examples:
  # 100,000 recipients by email, beside the PostgreSQL queue peer (../shared/bench)
  tidings bench campaign
  # A quick run of Tidings alone, by push in send batches
  tidings bench campaign --recipients 2000 --channel push --no-peer
  # Three runs and their spread, the databases kept in /tmp/bench
  tidings bench campaign --recipients 20000 --runs 3 --data-dir /tmp/bench

The JSON report is on stdout; the progress bar and the summary on stderr.";

pub const BENCH_RESERVE: &str = "\
Examples:
  tidings bench reserve --orders 20000 --units 10000 --concurrency 32
  # One hot SKU with its counter in 8 shards, Tidings alone
  tidings bench reserve --shards 8 --no-peer
  # POST /v1/orders over loopback with wrk, against a tidings serve started for the run
  tidings bench reserve --http --connections 16,64 --seconds 10";

pub const BENCH_IMPORT: &str = "\
Examples:
  tidings bench import --users 100000
  tidings bench import --users 10000 --data-dir /tmp/bench-import";

pub const BENCH_DIGEST: &str = "\
Examples:
  # 100,000 triggers (100 notifications of 1,000 users) into 10,000 users' digests
  tidings bench digest
  # One notification per trigger
  tidings bench digest --users 2000 --per-request 1
  # On the emulators (a build with --features aws): tables and queues made first
  tidings bench digest --backend aws --bootstrap --users 1000

The JSON report is on stdout; the progress and the summary on stderr.";

pub const IMPORT: &str = "\
Examples:
  # Where tidings serve runs (or with its --data-dir)
  tidings import users customers.csv --tenant acme
  tidings import pinpoint ./pinpoint-export/ --tenant acme
  # A deployed stack's table, with your AWS credentials (a build with --features aws)
  TIDINGS_TABLE=tidings-prod tidings import users customers.ndjson --tenant acme --backend aws

Run it again to finish an interrupted import: what is already there is not written again.";

pub const IMPORT_USERS: &str = "\
Examples:
  # user_id,email,phone,locale,timezone,tags,marketing_opt_out (tags separated by ;)
  tidings import users customers.csv --tenant acme
  # One user object a line, as POST /v1/users/batch takes them
  tidings import users customers.ndjson --tenant acme --data-dir /var/lib/tidings";

pub const IMPORT_PINPOINT: &str = "\
Examples:
  # The objects of a Pinpoint export job, copied from its bucket (aws s3 cp --recursive)
  tidings import pinpoint ./pinpoint-export/ --tenant acme
  # Endpoints without a user id become users named by the endpoint
  tidings import pinpoint ./pinpoint-export/ --tenant acme --endpoint-id-as-user";

pub const KEYS: &str = "\
Examples:
  # Where tidings serve runs (or with its --data-dir)
  tidings keys create --role operator --name 'ops laptop'
  tidings keys list --tenant acme --data-dir /var/lib/tidings
  # A deployed stack's table, with your AWS credentials (a build with --features aws)
  TIDINGS_TABLE=tidings-prod tidings keys create --role tenant --tenant acme --name checkout --backend aws";

pub const KEYS_CREATE: &str = "\
Examples:
  tidings keys create --role operator --name 'ops laptop'
  tidings keys create --role tenant --tenant acme --name checkout --expires-at 2027-01-01T00:00:00Z

The key's secret is in the JSON on stdout, this once.";

pub const KEYS_LIST: &str = "\
Examples:
  tidings keys list
  tidings keys list --tenant acme --data-dir /var/lib/tidings";

pub const KEYS_ROTATE: &str = "\
Examples:
  # The old key keeps working for an hour
  tidings keys rotate key_0123456789abcdef --grace-seconds 3600";

pub const KEYS_REVOKE: &str = "\
Examples:
  tidings keys revoke key_0123456789abcdef";

pub const OPENAPI: &str = "\
Examples:
  tidings openapi > openapi.json";

pub const CONFIG: &str = "\
Examples:
  tidings config
  # As the commands run with this data directory would see it, as one JSON document
  tidings config --json --data-dir /var/lib/tidings
  # The table of docs/configuration.md: every variable, its default and meaning
  tidings config --table";

pub const OPS: &str = "\
Examples:
  tidings ops dlq list
  tidings ops dlq redrive email-low
  tidings ops findings list
  tidings ops stream-failures list --backend aws";

pub const OPS_DLQ: &str = "\
Examples:
  tidings ops dlq list
  tidings ops dlq redrive sms-high";

pub const OPS_DLQ_LIST: &str = "\
Examples:
  tidings ops dlq list
  # Up to 100 dead letters of each queue, of a deployed stack (a build with --features aws)
  tidings ops dlq list --limit 100 --backend aws";

pub const OPS_DLQ_REDRIVE: &str = "\
Examples:
  # After the cause is fixed: each letter is handled once (the delivery record decides)
  tidings ops dlq redrive email-low";

pub const OPS_FINDINGS: &str = "\
Examples:
  tidings ops findings list
  tidings ops findings settle 0193a4e8c1f07c2a9d6b3e5f7a8b9c0d --kind accepted --reason 'counted by hand, ticket 4411'";

pub const OPS_FINDINGS_LIST: &str = "\
Examples:
  tidings ops findings list
  # What was settled, by whom and why, of a deployed stack (a build with --features aws)
  tidings ops findings list --status settled --limit 100 --backend aws";

pub const OPS_FINDINGS_SETTLE: &str = "\
Examples:
  # The counters are right (counted on the shelf): a ledger entry makes the ledger agree
  tidings ops findings settle 0193a4e8c1f07c2a9d6b3e5f7a8b9c0d --kind corrective_entry --reason 'shelf count 2026-12-01'
  # Known and accepted: the same difference is not reported as a finding again
  tidings ops findings settle 0193a4e8c1f07c2a9d6b3e5f7a8b9c0d --kind accepted --reason 'legacy import' --by alice";

pub const OPS_STREAM_FAILURES: &str = "\
Examples:
  tidings ops stream-failures list
  tidings ops stream-failures replay";

pub const OPS_STREAM_FAILURES_LIST: &str = "\
Examples:
  tidings ops stream-failures list
  tidings ops stream-failures list --backend aws";

pub const OPS_STREAM_FAILURES_REPLAY: &str = "\
Examples:
  # After the item is fixed: what each entry names is driven again, the entry deleted
  tidings ops stream-failures replay";
