from vramdoctor.cli import run

run()
