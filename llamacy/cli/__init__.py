"""The `llamacy` command. Errors become one line on stderr and a non-zero exit code."""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> None:
    debug = os.environ.get("LLAMACY_DEBUG", "") not in ("", "0")
    try:
        from llamacy.cli.app import app_for

        args = sys.argv[1:] if argv is None else argv
        app_for(args)(args=args, prog_name="llamacy")
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        sys.exit(130)
    except BrokenPipeError:
        # The reader went away (`llamacy run ... | head`): not an error worth a message.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except Exception as e:  # the one place errors turn into messages
        from llamacy.errors import LlamacyError

        if debug:
            raise
        if isinstance(e, LlamacyError):
            sys.stderr.write(f"llamacy: error: {e}\n")
            sys.exit(e.exit_code)
        if isinstance(e, MemoryError):
            sys.stderr.write("llamacy: error: out of memory (try a smaller --ctx-size)\n")
            sys.exit(1)
        first = str(e).splitlines()[0] if str(e) else ""
        sys.stderr.write(
            f"llamacy: internal error: {type(e).__name__}: {first} (LLAMACY_DEBUG=1 shows the traceback)\n"
        )
        sys.exit(1)
