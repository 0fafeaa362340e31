"""The series machinery: the claims framework, exercises, the notebook registry, generators and the hosted
bootstrap (docs/MAINTAINING.md, "The package")."""
