from primefs.cli.main import main

main()
