package deploy_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"
)

// TestPrometheusScrapesEveryInstance: deploy/prometheus/prometheus.yml
// scrapes each hub instance of docker-compose.yml directly (never through the
// balancer), and the monitoring overlay waits for each of them.
func TestPrometheusScrapesEveryInstance(t *testing.T) {
	c := readCompose(t)
	var want []string
	for name, s := range c.Services {
		if s.Environment["MARCONI_INSTANCE_ID"] != "" {
			want = append(want, name+":8080")
		}
	}
	slices.Sort(want)
	if len(want) < 2 {
		t.Fatalf("docker-compose.yml has %d hub instances, want several", len(want))
	}

	var prom struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "prometheus/prometheus.yml", &prom)
	var got []string
	for _, sc := range prom.ScrapeConfigs {
		if sc.JobName != "marconi" {
			continue
		}
		for _, st := range sc.StaticConfigs {
			got = append(got, st.Targets...)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("prometheus.yml job marconi scrapes %v, want every instance of docker-compose.yml: %v", got, want)
	}

	var overlay struct {
		Services map[string]struct {
			DependsOn []string `yaml:"depends_on"`
			Volumes   []string `yaml:"volumes"`
		} `yaml:"services"`
	}
	readYAML(t, "docker-compose.monitoring.yml", &overlay)
	deps := overlay.Services["prometheus"].DependsOn
	for _, w := range want {
		if !slices.Contains(deps, strings.TrimSuffix(w, ":8080")) {
			t.Errorf("the monitoring overlay's prometheus does not depend on %s", w)
		}
	}
	// Every file the overlay mounts exists.
	for _, svc := range overlay.Services {
		for _, v := range svc.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if _, err := os.Stat("../" + src); err != nil {
				t.Errorf("the monitoring overlay mounts %s: %v", src, err)
			}
		}
	}
}

func readYAML(t *testing.T, path string, out any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, out); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
