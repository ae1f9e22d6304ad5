from primefs.cli import main

main()
