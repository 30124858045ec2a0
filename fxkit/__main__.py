from fxkit.cli import main

main()
