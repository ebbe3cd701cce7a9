module github.com/acme/semver

go 1.19
