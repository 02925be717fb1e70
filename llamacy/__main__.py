from llamacy.cli import main

main()
