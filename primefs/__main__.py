from primefs.cli.main import program

program()
