package main

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/hub"
)

// Development credentials kept across restarts.
//
// Development mode generates an API key and an admin token when none is
// configured. Agents hold that key and an operator that token across a
// restart of the hub, on either store: with a fresh key each start, a
// restarted hub would answer its agents 401 and they would stop for good (on
// the in-memory store they come back with 410 and register again under the
// same key). The store cannot give a key back (it keeps only hashes of
// secrets), so the credentials are kept in a file readable by the user alone
// (0600) and reused at every start.

// defaultDevCredentialsFile is $XDG_STATE_HOME/marconi/dev-credentials, or
// ~/.local/state/marconi/dev-credentials.
func defaultDevCredentialsFile(getenv func(string) string) (string, error) {
	dir := getenv("XDG_STATE_HOME")
	if dir == "" {
		home := getenv("HOME")
		if home == "" {
			return "", errors.New("neither XDG_STATE_HOME nor HOME is set; set MARCONI_DEV_CREDENTIALS_FILE")
		}
		dir = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(dir, "marconi", "dev-credentials"), nil
}

// keepDevCredentials replaces the credentials development mode generated with
// those kept in the file (creating it on first use). Configured credentials
// are never written.
func keepDevCredentials(cfg *Config, getenv func(string) string) error {
	if cfg.Hub.Mode != marconi.Development || (cfg.generatedAPIKey == "" && cfg.generatedAdminToken == "") {
		return nil
	}
	path := getenv("MARCONI_DEV_CREDENTIALS_FILE")
	if path == "" {
		var err error
		if path, err = defaultDevCredentialsFile(getenv); err != nil {
			return fmt.Errorf("MARCONI_DEV_CREDENTIALS_FILE: %w", err)
		}
	}
	kept, err := readDevCredentials(path)
	if errors.Is(err, fs.ErrNotExist) {
		kept = map[string]string{"api_key": hub.NewAPIKey(), "admin_token": hub.NewAdminToken()}
		err = writeDevCredentials(path, kept)
	}
	if err != nil {
		return fmt.Errorf("MARCONI_DEV_CREDENTIALS_FILE: %w", err)
	}
	if cfg.generatedAPIKey != "" {
		cfg.generatedAPIKey = kept["api_key"]
		cfg.Hub.APIKeys = map[string]hub.TenantProject{cfg.generatedAPIKey: {TenantID: "dev", ProjectID: "dev"}}
	}
	if cfg.generatedAdminToken != "" {
		cfg.generatedAdminToken = kept["admin_token"]
		cfg.Hub.AdminToken = cfg.generatedAdminToken
	}
	cfg.devCredentialsFile = path
	return nil
}

func readDevCredentials(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s is readable by others (mode %v); chmod 600 it or delete it", path, st.Mode().Perm())
	}
	kept := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "="); ok {
			kept[k] = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(kept["api_key"]) < 16 || len(kept["admin_token"]) < 16 {
		return nil, fmt.Errorf("%s lacks api_key= or admin_token= of at least 16 characters; delete it for new ones", path)
	}
	return kept, nil
}

func writeDevCredentials(path string, kept map[string]string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	text := "# Marconi development credentials, reused at every start; delete this file for new ones.\n" +
		"api_key=" + kept["api_key"] + "\nadmin_token=" + kept["admin_token"] + "\n"
	// O_EXCL: two instances starting together must not overwrite each other.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		got, rerr := readDevCredentials(path)
		if rerr == nil {
			kept["api_key"], kept["admin_token"] = got["api_key"], got["admin_token"]
		}
		return rerr
	}
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
